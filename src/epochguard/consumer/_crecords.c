/*
 * The records of one (already decompressed) Kafka v2 record batch to ConsumerRecord tuples.
 *
 * A C twin of epochguard.consumer.records._decode_batch_records: same arguments, same
 * output, same CorruptRecordError messages (tests/consumer/test_crecords.py checks both
 * decoders against each other). Everything outside the per-record loop (batch headers,
 * CRC, transactions, decompression) stays in Python, where it costs one call per batch.
 *
 * Every read is bounds-checked against `end`: corrupt input raises, it never reads outside
 * the buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#define N_FIELDS 13

static PyObject *corrupt_error; /* epochguard.consumer.errors.CorruptRecordError */

/* Outcome of a varint read: 0 ok, -1 truncated, -2 too long. */
static inline int
read_varint(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, int64_t *out)
{
    uint64_t result = 0;
    int shift = 0;
    Py_ssize_t p = *pos;
    for (;;) {
        if (p >= end)
            return -1;
        unsigned int b = buf[p++];
        /* The tenth byte may only carry bit 63; Python's decoder raises the same way. */
        if (shift == 63 && b > 1)
            return -2;
        result |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *pos = p;
            *out = (int64_t)(result >> 1) ^ -(int64_t)(result & 1);
            return 0;
        }
        shift += 7;
    }
}

static void
raise_truncated(PyObject *topic, PyObject *partition, long long base_offset)
{
    PyErr_Format(corrupt_error, "%U-%S: truncated record in batch at offset %lld", topic,
                 partition, base_offset);
}

static PyObject *
sum_ll(long long a, long long b)
{
    long long r;
    if (!__builtin_add_overflow(a, b, &r))
        return PyLong_FromLongLong(r);
    /* Only corrupt or absurd batches get here; Python ints do not overflow. */
    PyObject *pa = PyLong_FromLongLong(a);
    PyObject *pb = PyLong_FromLongLong(b);
    PyObject *res = NULL;
    if (pa && pb)
        res = PyNumber_Add(pa, pb);
    Py_XDECREF(pa);
    Py_XDECREF(pb);
    return res;
}

/*
 * Keep a record whose key and value are atomic (bytes or None without deserializers; str,
 * int, float, bool from one) out of the cyclic GC: the tuple is never tracked, its headers
 * list (and pairs) are untracked once built. Such a record cannot be part of a
 * reference cycle, yet every record would otherwise add two tracked containers (the tuple
 * and its headers list), and full collections over the records a consumer keeps buffered
 * cost more than decoding them (measured: about 60% of decode time at 100 B values).
 * CPython untracks atomic-only tuples itself, but only later and never lists. The one
 * cost: a cycle built by the application *through a record's headers list* would not be
 * collected (docs/consumer.md says so).
 */
/* Immutable and never a container; an untracked dict, by contrast, may be tracked again. */
static inline int
is_atomic(PyObject *o)
{
    return o == Py_None || PyBytes_CheckExact(o) || PyUnicode_CheckExact(o) ||
           PyLong_CheckExact(o) || PyFloat_CheckExact(o) || PyBool_Check(o);
}

static void
untrack_headers(PyObject *headers)
{
    Py_ssize_t n = PyList_GET_SIZE(headers);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(headers, i);
        if (PyObject_GC_IsTracked(pair))
            PyObject_GC_UnTrack(pair);
    }
    PyObject_GC_UnTrack(headers);
}

/*
 * A record's key or value size as an int. Records of a batch mostly share their sizes, and
 * sizes above 256 are not among CPython's cached small ints: the int of the previous equal
 * size is shared (ints are immutable), instead of a new one per record.
 */
struct size_cache {
    int64_t n;
    PyObject *obj; /* borrowed from the records that hold it; NULL before the first */
};

static inline PyObject *
size_obj(struct size_cache *c, int64_t n)
{
    if (c->obj != NULL && c->n == n)
        return Py_NewRef(c->obj);
    PyObject *o = PyLong_FromLongLong(n);
    if (o != NULL) {
        c->n = n;
        c->obj = o;
    }
    return o;
}

static PyObject *
call_deserializer(PyObject *fn, PyObject *topic, PyObject *headers, PyObject *data)
{
    PyObject *args[3] = {topic, headers, data};
    return PyObject_Vectorcall(fn, args, 3, NULL);
}

#define VARINT(dst)                                                                         \
    do {                                                                                    \
        int rc_ = read_varint(buf, &pos, end, &(dst));                                      \
        if (rc_ == -1)                                                                      \
            goto truncated;                                                                 \
        if (rc_ == -2)                                                                      \
            goto too_long;                                                                  \
    } while (0)

PyDoc_STRVAR(decode_batch_records_doc,
"decode_batch_records(buf, pos, end, count, topic, partition, epoch, base_offset, base_ts,\n"
"    ts_type, log_append_ts, min_offset, out, key_des, value_des, record_cls)\n"
"--\n\n"
"Append the records of buf[pos:end] with offset >= min_offset to out as record_cls\n"
"tuples; raises CorruptRecordError on malformed input.");

/* The body of decode_batch_records over buf[0:size], which the caller keeps alive. */
static PyObject *
decode_in(PyObject *const *args, const unsigned char *buf, Py_ssize_t size)
{
    PyObject *topic = args[4], *partition = args[5], *epoch = args[6];
    PyObject *ts_type = args[9], *log_append_ts = args[10];
    PyObject *out = args[12], *key_des = args[13], *value_des = args[14];
    PyObject *cls_obj = args[15];

    if (!PyUnicode_Check(topic)) {
        PyErr_SetString(PyExc_TypeError, "topic must be str");
        return NULL;
    }
    if (!PyList_Check(out)) {
        PyErr_SetString(PyExc_TypeError, "out must be a list");
        return NULL;
    }
    if (!PyType_Check(cls_obj) || !PyType_IsSubtype((PyTypeObject *)cls_obj, &PyTuple_Type) ||
        ((PyTypeObject *)cls_obj)->tp_basicsize != PyTuple_Type.tp_basicsize) {
        /* Filling the tuple's slots directly is only right for a slot-less tuple subclass
           such as a NamedTuple. */
        PyErr_SetString(PyExc_TypeError, "record_cls must be a NamedTuple class");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)cls_obj;
    if (key_des == Py_None)
        key_des = NULL;
    if (value_des == Py_None)
        value_des = NULL;

    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    long long count = PyLong_AsLongLong(args[3]);
    long long base_offset = PyLong_AsLongLong(args[7]);
    long long base_ts = PyLong_AsLongLong(args[8]);
    long long min_offset = PyLong_AsLongLong(args[11]);
    if (PyErr_Occurred())
        return NULL;
    if (end > size)
        end = size;
    if (pos < 0) {
        PyErr_SetString(PyExc_ValueError, "pos must not be negative");
        return NULL;
    }

    /* Each size's int is held by a record in `out` (which the caller keeps) until the
       loop ends, so the borrowed references stay valid. */
    struct size_cache size_cache[2] = {{0, NULL}, {0, NULL}};
    for (long long i = 0; i < count; i++) {
        int64_t ts_delta, off_delta, klen, vlen, nh;
        PyObject *key = NULL, *value = NULL, *headers = NULL, *rec = NULL;
        long long hsize;

        int64_t size;
        VARINT(size);
        Py_ssize_t record_start = pos;
        if (pos >= end)
            goto truncated; /* record attributes, unused */
        pos++;
        VARINT(ts_delta);
        VARINT(off_delta);
        VARINT(klen);
        if (klen >= 0) {
            if (klen > end - pos)
                goto truncated;
            key = PyBytes_FromStringAndSize((const char *)buf + pos, (Py_ssize_t)klen);
            if (key == NULL)
                return NULL;
            pos += (Py_ssize_t)klen;
        }
        VARINT(vlen);
        if (vlen >= 0) {
            if (vlen > end - pos)
                goto truncated_k;
            value = PyBytes_FromStringAndSize((const char *)buf + pos, (Py_ssize_t)vlen);
            if (value == NULL)
                goto fail_kv;
            pos += (Py_ssize_t)vlen;
        }
        headers = PyList_New(0);
        if (headers == NULL)
            goto fail_kv;
        if (pos >= end)
            goto truncated_kvh;
        if (buf[pos] == 0) {
            pos++;
            hsize = -1;
        }
        else {
            hsize = 0;
            int rc = read_varint(buf, &pos, end, &nh);
            if (rc == -1)
                goto truncated_kvh;
            if (rc == -2)
                goto too_long_kvh;
            for (int64_t h = 0; h < nh; h++) {
                int64_t hklen, hvlen;
                rc = read_varint(buf, &pos, end, &hklen);
                if (rc == -1)
                    goto truncated_kvh;
                if (rc == -2)
                    goto too_long_kvh;
                if (hklen < 0) {
                    PyErr_Format(corrupt_error,
                                 "%U-%S: negative header key length in batch at offset %lld",
                                 topic, partition, base_offset);
                    goto fail_kvh;
                }
                if (hklen > end - pos)
                    goto truncated_kvh;
                PyObject *hkey =
                    PyUnicode_DecodeUTF8((const char *)buf + pos, (Py_ssize_t)hklen, NULL);
                if (hkey == NULL) {
                    if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                        PyErr_Clear();
                        PyErr_Format(corrupt_error,
                                     "%U-%S: header key is not UTF-8 in batch at offset %lld",
                                     topic, partition, base_offset);
                    }
                    goto fail_kvh;
                }
                pos += (Py_ssize_t)hklen;
                rc = read_varint(buf, &pos, end, &hvlen);
                if (rc != 0) {
                    Py_DECREF(hkey);
                    if (rc == -1)
                        goto truncated_kvh;
                    goto too_long_kvh;
                }
                PyObject *hval;
                if (hvlen >= 0) {
                    if (hvlen > end - pos) {
                        Py_DECREF(hkey);
                        goto truncated_kvh;
                    }
                    hval = PyBytes_FromStringAndSize((const char *)buf + pos, (Py_ssize_t)hvlen);
                    if (hval == NULL) {
                        Py_DECREF(hkey);
                        goto fail_kvh;
                    }
                    pos += (Py_ssize_t)hvlen;
                    hsize += hklen + hvlen;
                }
                else {
                    hval = Py_NewRef(Py_None);
                    hsize += hklen;
                }
                PyObject *pair = PyTuple_New(2);
                if (pair == NULL) {
                    Py_DECREF(hkey);
                    Py_DECREF(hval);
                    goto fail_kvh;
                }
                PyTuple_SET_ITEM(pair, 0, hkey);
                PyTuple_SET_ITEM(pair, 1, hval);
                int ok = PyList_Append(headers, pair);
                Py_DECREF(pair);
                if (ok < 0)
                    goto fail_kvh;
            }
        }

        if (pos - record_start != size) {
            /* Java's DefaultRecord.readFrom refuses it too: the fields and the declared
               size disagree, so at least one of them is wrong. */
            PyErr_Format(corrupt_error,
                         "%U-%S: record %lld of the batch at offset %lld declares %lld bytes "
                         "but holds %zd",
                         topic, partition, i, base_offset, (long long)size, pos - record_start);
            goto fail_kvh;
        }
        long long offset;
        if (__builtin_add_overflow(base_offset, off_delta, &offset)) {
            /* Python compares unbounded ints; an overflowing offset is far above any
               min_offset when off_delta > 0 and far below when < 0. */
            if (off_delta < 0)
                goto skip_record;
        }
        else if (offset < min_offset) {
            goto skip_record;
        }
        if (key == NULL)
            key = Py_NewRef(Py_None);
        if (value == NULL)
            value = Py_NewRef(Py_None);
        if (key_des != NULL) {
            PyObject *k = call_deserializer(key_des, topic, headers, key);
            Py_DECREF(key);
            key = k;
            if (key == NULL)
                goto fail_kvh;
        }
        if (value_des != NULL) {
            PyObject *v = call_deserializer(value_des, topic, headers, value);
            Py_DECREF(value);
            value = v;
            if (value == NULL)
                goto fail_kvh;
        }
        {
            PyObject *offset_obj = sum_ll(base_offset, off_delta);
            if (offset_obj == NULL)
                goto fail_kvh;
            PyObject *ts_obj;
            if (log_append_ts == Py_None)
                ts_obj = sum_ll(base_ts, ts_delta);
            else
                ts_obj = Py_NewRef(log_append_ts);
            if (ts_obj == NULL) {
                Py_DECREF(offset_obj);
                goto fail_kvh;
            }
            PyObject *ks = size_obj(&size_cache[0], klen);
            PyObject *vs = size_obj(&size_cache[1], vlen);
            PyObject *hs = PyLong_FromLongLong(hsize);
            /* Not tp_alloc (PyType_GenericAlloc): that zeroes the slots and tracks the
               tuple, which is then filled at once and, most often, untracked again. Up to
               3.13 a tuple has no field beyond its items (3.14 caches its hash in one that
               its own allocator sets): later versions take tp_alloc. */
#if PY_VERSION_HEX < 0x030E0000
            rec = ks && vs && hs ? (PyObject *)PyObject_GC_NewVar(PyTupleObject, cls, N_FIELDS)
                                 : NULL;
#else
            rec = ks && vs && hs ? cls->tp_alloc(cls, N_FIELDS) : NULL;
            if (rec != NULL)
                PyObject_GC_UnTrack(rec);
#endif
            if (rec == NULL) {
                Py_DECREF(offset_obj);
                Py_DECREF(ts_obj);
                Py_XDECREF(ks);
                Py_XDECREF(vs);
                Py_XDECREF(hs);
                goto fail_kvh;
            }
            PyTuple_SET_ITEM(rec, 0, Py_NewRef(topic));
            PyTuple_SET_ITEM(rec, 1, Py_NewRef(partition));
            PyTuple_SET_ITEM(rec, 2, Py_NewRef(epoch));
            PyTuple_SET_ITEM(rec, 3, offset_obj);
            PyTuple_SET_ITEM(rec, 4, ts_obj);
            PyTuple_SET_ITEM(rec, 5, Py_NewRef(ts_type));
            PyTuple_SET_ITEM(rec, 6, key);
            PyTuple_SET_ITEM(rec, 7, value);
            PyTuple_SET_ITEM(rec, 8, headers);
            PyTuple_SET_ITEM(rec, 9, Py_NewRef(Py_None));
            PyTuple_SET_ITEM(rec, 10, ks);
            PyTuple_SET_ITEM(rec, 11, vs);
            PyTuple_SET_ITEM(rec, 12, hs);
            if (is_atomic(key) && is_atomic(value))
                untrack_headers(headers);
            else
                PyObject_GC_Track(rec);
            int ok = PyList_Append(out, rec);
            Py_DECREF(rec);
            if (ok < 0)
                return NULL;
            continue;
        }
    skip_record:
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_DECREF(headers);
        continue;

    truncated_kvh:
        Py_DECREF(headers);
        Py_XDECREF(value);
    truncated_k:
        Py_XDECREF(key);
        goto truncated;
    too_long_kvh:
        Py_DECREF(headers);
        Py_XDECREF(key);
        Py_XDECREF(value);
        goto too_long;
    fail_kvh:
        Py_XDECREF(headers);
    fail_kv:
        Py_XDECREF(key);
        Py_XDECREF(value);
        return NULL;
    }
    if (pos != end) {
        PyErr_Format(corrupt_error,
                     "%U-%S: the batch at offset %lld has %zd byte%s after its %lld record%s",
                     topic, partition, base_offset, end - pos, end - pos == 1 ? "" : "s",
                     count, count == 1 ? "" : "s");
        return NULL;
    }
    Py_RETURN_NONE;

truncated:
    raise_truncated(topic, partition, base_offset);
    return NULL;
too_long:
    PyErr_SetString(corrupt_error, "varint too long");
    return NULL;
}

typedef PyObject *(*decode_fn)(PyObject *const *, const unsigned char *, Py_ssize_t);

/* Run `fn` over args[0], which the caller's argument keeps alive: bytes as they are, or a
   memoryview into a Fetch response frame (the lean response path), decoded in place so the
   records section is never copied before its keys and values are. */
static PyObject *
over_buffer(PyObject *const *args, decode_fn fn)
{
    PyObject *data = args[0];
    if (PyBytes_CheckExact(data))
        return fn(args, (const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data));
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "buf must be bytes or a contiguous byte buffer");
        return NULL;
    }
    PyObject *result = fn(args, (const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *
decode_batch_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 16) {
        PyErr_Format(PyExc_TypeError, "decode_batch_records expects 16 arguments, got %zd",
                     nargs);
        return NULL;
    }
    return over_buffer(args, decode_in);
}

/* ------------------------------------------------------------------ column output */

/*
 * The same records written into column buffers instead of tuples: no Python object per
 * record or field. The caller (epochguard.consumer.columns) owns eight bytearrays whose
 * contents are, after the call, the Arrow layouts of
 *   0 offsets     int64 per row
 *   1 timestamps  int64 per row (ms)
 *   2 key offsets int32, rows + 1 entries (starts with one 0 written by the caller)
 *   3 key data    the keys back to back
 *   4 key valid   validity bitmap, one bit per row, least significant bit first
 *   5..7          the same three for values
 * so pyarrow wraps them with Array.from_buffers without copying. Each bytearray is grown
 * once per batch to a bound (a record takes at least 7 bytes, keys and values at most the
 * batch's bytes) and cut back to what was written at the end.
 *
 * With fifteen bytearrays the headers are kept too, as Arrow's
 * list<struct<key: string, value: binary>> (Spark's Kafka source's headers column):
 *   8  header list offsets  int32, rows + 1 entries (starts with one 0)
 *   9  header list valid    one bit per row: set when the record has headers (a record
 *                           without headers is a null list, as in Spark's source)
 *   10 header key offsets   int32, headers + 1 entries (starts with one 0)
 *   11 header key data
 *   12 header value offsets int32, headers + 1 entries (starts with one 0)
 *   13 header value data
 *   14 header value valid   one bit per header
 * A header takes at least 2 bytes (its two lengths), which bounds their number.
 */
#define N_COLS 8
#define N_COLS_HEADERS 15
#define MIN_RECORD_BYTES 7
#define MIN_HEADER_BYTES 2

static int
grow(PyObject *ba, Py_ssize_t extra)
{
    return PyByteArray_Resize(ba, PyByteArray_GET_SIZE(ba) + extra);
}

static inline void
set_bit(unsigned char *bitmap, Py_ssize_t row)
{
    bitmap[row >> 3] |= (unsigned char)(1u << (row & 7));
}

PyDoc_STRVAR(decode_batch_columns_doc,
"decode_batch_columns(buf, pos, end, count, topic, partition, base_offset, base_ts,\n"
"    log_append_ts, min_offset, cols)\n"
"--\n\n"
"Append the records of buf[pos:end] with offset >= min_offset to the eight column\n"
"bytearrays in cols (fifteen: the headers too); returns (rows, null keys, null values).\n"
"Raises CorruptRecordError on malformed input, with the messages of decode_batch_records.");

/*
 * Batches of at least this many bytes are decoded with the GIL released: the loop below
 * touches no Python object, and in a Spark executor the thread handing the previous
 * batch to the JVM (and the consumer's IO thread) would otherwise wait for the whole
 * copy of a fetch. Smaller batches keep the GIL: releasing and taking it back costs more
 * than it frees. set_release_gil_bytes() changes it (tests run both paths).
 */
static Py_ssize_t release_gil_bytes = 64 * 1024;

/* Why the loop stopped early, for the message written once the GIL is held again. */
enum col_error {
    COL_OK = 0,
    COL_TRUNCATED,      /* a record runs past the batch */
    COL_VARINT_LONG,    /* a varint of more than 10 bytes */
    COL_NEG_HKEY,       /* a header key with a negative length */
    COL_HKEY_UTF8,      /* a header key that is not UTF-8 */
    COL_SIZE_MISMATCH,  /* a record's length field differs from what it holds */
    COL_OFFSET_OVERFLOW,
    COL_TS_OVERFLOW,
    COL_DATA_2GIB,      /* keys or values of one fetch past Arrow's int32 offsets */
    COL_TRAILING,       /* bytes after the batch's records */
};

struct col_loop {
    /* in */
    const unsigned char *buf;
    Py_ssize_t pos, end;
    long long count, base_offset, base_ts, min_offset, append_ts;
    int use_append_ts;
    Py_ssize_t cap;
    char *offsets, *stamps, *koffs, *kdata, *voffs, *vdata;
    unsigned char *kvalid, *vvalid;
    int with_headers;
    Py_ssize_t hcap;
    char *hoffs, *hkoffs, *hkdata, *hvoffs, *hvdata;
    unsigned char *hvalid, *hvvalid;
    /* in and out */
    Py_ssize_t row, klen_total, vlen_total;
    Py_ssize_t hrow, hklen_total, hvlen_total; /* headers written, their key/value bytes */
    /* out */
    long long key_nulls, value_nulls;
    enum col_error error;
    long long bad_record;        /* COL_SIZE_MISMATCH: the record's index in the batch */
    long long declared, held;    /* COL_SIZE_MISMATCH: its length field, its bytes */
};

/* Strict UTF-8 (Unicode's well-formed sequences, as Python's "strict" decoder): no
 * overlong forms, no surrogates, nothing past U+10FFFF. */
static int
utf8_valid(const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        Py_ssize_t len;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        }
        else
            return 0;
        if (len > n - i)
            return 0;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (Py_ssize_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF)
                return 0;
        i += len;
    }
    return 1;
}

/* The per-record loop: no Python API, so it may run without the GIL. Compiled twice
 * (columns_loop below), with and without headers: with the choice a run-time test, the
 * loop without headers ran 10% slower than before headers existed (100 B records:
 * 183 us per 20,000 before, 205 with the test, 190 compiled twice). */
static inline __attribute__((always_inline)) void
columns_loop_impl(struct col_loop *L, const int with_headers)
{
    const unsigned char *buf = L->buf;
    Py_ssize_t pos = L->pos, end = L->end;
    Py_ssize_t row = L->row, rows0 = L->row, klen_total = L->klen_total,
               vlen_total = L->vlen_total;
    Py_ssize_t hrow = L->hrow, hrows0 = L->hrow, hklen_total = L->hklen_total,
               hvlen_total = L->hvlen_total;
    long long key_nulls = 0, value_nulls = 0;
    enum col_error error = COL_OK;

    for (long long i = 0; i < L->count; i++) {
        int64_t size, ts_delta, off_delta, klen, vlen, nh = 0;
        Py_ssize_t kpos = 0, vpos = 0, hpos, record_start;
        int rc;
#define CVARINT(dst)                                                                        \
    do {                                                                                    \
        rc = read_varint(buf, &pos, end, &(dst));                                           \
        if (rc != 0) {                                                                      \
            error = rc == -1 ? COL_TRUNCATED : COL_VARINT_LONG;                             \
            goto done;                                                                      \
        }                                                                                   \
    } while (0)
        CVARINT(size);
        record_start = pos;
        if (pos >= end) {
            error = COL_TRUNCATED;
            goto done;
        }
        pos++;
        CVARINT(ts_delta);
        CVARINT(off_delta);
        CVARINT(klen);
        if (klen >= 0) {
            if (klen > end - pos) {
                error = COL_TRUNCATED;
                goto done;
            }
            kpos = pos;
            pos += (Py_ssize_t)klen;
        }
        CVARINT(vlen);
        if (vlen >= 0) {
            if (vlen > end - pos) {
                error = COL_TRUNCATED;
                goto done;
            }
            vpos = pos;
            pos += (Py_ssize_t)vlen;
        }
        if (pos >= end) {
            error = COL_TRUNCATED;
            goto done;
        }
        hpos = pos;
        if (buf[pos] == 0) {
            pos++;
        }
        else {
            CVARINT(nh);
            for (int64_t h = 0; h < nh; h++) {
                int64_t hklen, hvlen;
                CVARINT(hklen);
                if (hklen < 0) {
                    error = COL_NEG_HKEY;
                    goto done;
                }
                if (hklen > end - pos) {
                    error = COL_TRUNCATED;
                    goto done;
                }
                /* Header keys are checked as the tuple decoder checks them. */
                if (!utf8_valid(buf + pos, (Py_ssize_t)hklen)) {
                    error = COL_HKEY_UTF8;
                    goto done;
                }
                pos += (Py_ssize_t)hklen;
                CVARINT(hvlen);
                if (hvlen >= 0) {
                    if (hvlen > end - pos) {
                        error = COL_TRUNCATED;
                        goto done;
                    }
                    pos += (Py_ssize_t)hvlen;
                }
            }
        }
#undef CVARINT
        if (pos - record_start != size) {
            error = COL_SIZE_MISMATCH;
            L->bad_record = i;
            L->declared = (long long)size;
            L->held = (long long)(pos - record_start);
            goto done;
        }
        long long offset;
        if (__builtin_add_overflow(L->base_offset, off_delta, &offset)) {
            if (off_delta < 0)
                continue;
            error = COL_OFFSET_OVERFLOW;
            goto done;
        }
        if (offset < L->min_offset)
            continue;
        long long ts;
        if (L->use_append_ts)
            ts = L->append_ts;
        else if (__builtin_add_overflow(L->base_ts, ts_delta, &ts)) {
            error = COL_TS_OVERFLOW;
            goto done;
        }
        if (row - rows0 >= L->cap) {
            error = COL_TRUNCATED; /* cannot happen: each record took MIN_RECORD_BYTES+ */
            goto done;
        }
        int64_t off64 = offset, ts64 = ts;
        memcpy(L->offsets + 8 * row, &off64, 8);
        memcpy(L->stamps + 8 * row, &ts64, 8);
        if (klen >= 0) {
            memcpy(L->kdata + klen_total, buf + kpos, (size_t)klen);
            klen_total += (Py_ssize_t)klen;
        }
        else
            key_nulls++;
        if (vlen >= 0) {
            memcpy(L->vdata + vlen_total, buf + vpos, (size_t)vlen);
            vlen_total += (Py_ssize_t)vlen;
        }
        else
            value_nulls++;
        if (klen_total > INT32_MAX || vlen_total > INT32_MAX) {
            error = COL_DATA_2GIB;
            goto done;
        }
        int32_t ko = (int32_t)klen_total, vo = (int32_t)vlen_total;
        memcpy(L->koffs + 4 * (row + 1), &ko, 4);
        memcpy(L->voffs + 4 * (row + 1), &vo, 4);
        if (klen >= 0)
            set_bit(L->kvalid, row);
        if (vlen >= 0)
            set_bit(L->vvalid, row);
        if (with_headers) {
            if (nh > 0) {
                /* The second walk over headers the first one checked: only kept records
                 * are written, and a record below min_offset is known only after them. */
                Py_ssize_t p = hpos;
                int64_t count_again = 0, hklen = 0, hvlen = 0;
                read_varint(buf, &p, end, &count_again);
                if (hrow - hrows0 + nh > L->hcap) {
                    error = COL_TRUNCATED; /* cannot happen: a header takes 2 bytes+ */
                    goto done;
                }
                for (int64_t h = 0; h < nh; h++) {
                    read_varint(buf, &p, end, &hklen);
                    memcpy(L->hkdata + hklen_total, buf + p, (size_t)hklen);
                    hklen_total += (Py_ssize_t)hklen;
                    p += (Py_ssize_t)hklen;
                    read_varint(buf, &p, end, &hvlen);
                    if (hvlen >= 0) {
                        memcpy(L->hvdata + hvlen_total, buf + p, (size_t)hvlen);
                        hvlen_total += (Py_ssize_t)hvlen;
                        p += (Py_ssize_t)hvlen;
                        set_bit(L->hvvalid, hrow);
                    }
                    if (hklen_total > INT32_MAX || hvlen_total > INT32_MAX) {
                        error = COL_DATA_2GIB;
                        goto done;
                    }
                    int32_t hko = (int32_t)hklen_total, hvo = (int32_t)hvlen_total;
                    memcpy(L->hkoffs + 4 * (hrow + 1), &hko, 4);
                    memcpy(L->hvoffs + 4 * (hrow + 1), &hvo, 4);
                    hrow++;
                }
                if (hrow > INT32_MAX) {
                    error = COL_DATA_2GIB;
                    goto done;
                }
                set_bit(L->hvalid, row);
            }
            int32_t ho = (int32_t)hrow;
            memcpy(L->hoffs + 4 * (row + 1), &ho, 4);
        }
        row++;
    }
    if (pos > end)
        error = COL_TRUNCATED;
    else if (pos != end)
        error = COL_TRAILING;

done:
    L->pos = pos;
    L->row = row;
    L->klen_total = klen_total;
    L->vlen_total = vlen_total;
    L->hrow = hrow;
    L->hklen_total = hklen_total;
    L->hvlen_total = hvlen_total;
    L->key_nulls = key_nulls;
    L->value_nulls = value_nulls;
    L->error = error;
}

static void
columns_loop_plain(struct col_loop *L)
{
    columns_loop_impl(L, 0);
}

static void
columns_loop_headers(struct col_loop *L)
{
    columns_loop_impl(L, 1);
}

static void
columns_loop(struct col_loop *L)
{
    if (L->with_headers)
        columns_loop_headers(L);
    else
        columns_loop_plain(L);
}

static void
raise_col_error(const struct col_loop *L, PyObject *topic, PyObject *partition)
{
    long long base = L->base_offset;
    switch (L->error) {
    case COL_OK:
        return;
    case COL_TRUNCATED:
        raise_truncated(topic, partition, base);
        return;
    case COL_VARINT_LONG:
        PyErr_SetString(corrupt_error, "varint too long");
        return;
    case COL_NEG_HKEY:
        PyErr_Format(corrupt_error, "%U-%S: negative header key length in batch at offset %lld",
                     topic, partition, base);
        return;
    case COL_HKEY_UTF8:
        PyErr_Format(corrupt_error, "%U-%S: header key is not UTF-8 in batch at offset %lld",
                     topic, partition, base);
        return;
    case COL_SIZE_MISMATCH:
        PyErr_Format(corrupt_error,
                     "%U-%S: record %lld of the batch at offset %lld declares %lld bytes "
                     "but holds %zd",
                     topic, partition, L->bad_record, base, L->declared, (Py_ssize_t)L->held);
        return;
    case COL_OFFSET_OVERFLOW:
        PyErr_Format(corrupt_error, "%U-%S: record offset overflows in batch at offset %lld",
                     topic, partition, base);
        return;
    case COL_TS_OVERFLOW:
        PyErr_Format(corrupt_error, "%U-%S: record timestamp overflows in batch at offset %lld",
                     topic, partition, base);
        return;
    case COL_DATA_2GIB:
        PyErr_SetString(PyExc_OverflowError,
                        "column data of one fetch passes 2 GiB (Arrow binary offsets)");
        return;
    case COL_TRAILING:
        PyErr_Format(corrupt_error,
                     "%U-%S: the batch at offset %lld has %zd byte%s after its %lld record%s",
                     topic, partition, base, L->end - L->pos, L->end - L->pos == 1 ? "" : "s",
                     L->count, L->count == 1 ? "" : "s");
        return;
    }
}

static PyObject *columns_into(PyObject *const *args, const unsigned char *buf, Py_ssize_t size,
                              PyObject **cols, int n_cols);

static PyObject *
columns_in(PyObject *const *args, const unsigned char *buf, Py_ssize_t size)
{
    PyObject *cols_obj = args[10];
    PyObject *cols[N_COLS_HEADERS];

    if (!PyUnicode_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "topic must be str");
        return NULL;
    }
    if (!PyList_Check(cols_obj) || (PyList_GET_SIZE(cols_obj) != N_COLS &&
                                    PyList_GET_SIZE(cols_obj) != N_COLS_HEADERS)) {
        PyErr_SetString(PyExc_TypeError, "cols must be a list of 8 or 15 bytearrays");
        return NULL;
    }
    int n_cols = (int)PyList_GET_SIZE(cols_obj);
    for (int c = 0; c < n_cols; c++) {
        cols[c] = PyList_GET_ITEM(cols_obj, c);
        if (!PyByteArray_CheckExact(cols[c])) {
            PyErr_SetString(PyExc_TypeError, "cols must be a list of 8 or 15 bytearrays");
            return NULL;
        }
        /* Each column is sized for its own layout: one bytearray in two places would be
         * written past its end. */
        for (int d = 0; d < c; d++)
            if (cols[d] == cols[c]) {
                PyErr_Format(PyExc_ValueError, "cols %d and %d are the same bytearray", d, c);
                return NULL;
            }
    }
    /* Owned while they are used: the loop may run without the GIL, and another thread could
     * meanwhile replace an item of the list. */
    for (int c = 0; c < n_cols; c++)
        Py_INCREF(cols[c]);
    PyObject *result = columns_into(args, buf, size, cols, n_cols);
    for (int c = 0; c < n_cols; c++)
        Py_DECREF(cols[c]);
    return result;
}

static PyObject *
columns_into(PyObject *const *args, const unsigned char *buf, Py_ssize_t size, PyObject **cols,
             int n_cols)
{
    PyObject *topic = args[4], *partition = args[5], *log_append_ts = args[8];
    int with_headers = n_cols == N_COLS_HEADERS;
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    long long count = PyLong_AsLongLong(args[3]);
    long long base_offset = PyLong_AsLongLong(args[6]);
    long long base_ts = PyLong_AsLongLong(args[7]);
    long long min_offset = PyLong_AsLongLong(args[9]);
    long long append_ts = 0;
    int use_append_ts = log_append_ts != Py_None;
    if (use_append_ts)
        append_ts = PyLong_AsLongLong(log_append_ts);
    if (PyErr_Occurred())
        return NULL;
    if (end > size)
        end = size;
    if (pos < 0) {
        PyErr_SetString(PyExc_ValueError, "pos must not be negative");
        return NULL;
    }
    Py_ssize_t rows0 = PyByteArray_GET_SIZE(cols[0]) / 8;
    if (PyByteArray_GET_SIZE(cols[2]) != 4 * (rows0 + 1) ||
        PyByteArray_GET_SIZE(cols[5]) != 4 * (rows0 + 1) ||
        PyByteArray_GET_SIZE(cols[1]) != 8 * rows0 ||
        PyByteArray_GET_SIZE(cols[4]) != (rows0 + 7) / 8 ||
        PyByteArray_GET_SIZE(cols[7]) != (rows0 + 7) / 8) {
        PyErr_SetString(PyExc_ValueError, "cols do not hold the same number of rows");
        return NULL;
    }
    Py_ssize_t hrows0 = 0;
    if (with_headers) {
        hrows0 = PyByteArray_GET_SIZE(cols[10]) / 4 - 1;
        if (PyByteArray_GET_SIZE(cols[8]) != 4 * (rows0 + 1) ||
            PyByteArray_GET_SIZE(cols[9]) != (rows0 + 7) / 8 || hrows0 < 0 ||
            PyByteArray_GET_SIZE(cols[10]) != 4 * (hrows0 + 1) ||
            PyByteArray_GET_SIZE(cols[12]) != 4 * (hrows0 + 1) ||
            PyByteArray_GET_SIZE(cols[14]) != (hrows0 + 7) / 8) {
            PyErr_SetString(PyExc_ValueError, "header cols do not hold the same number of rows");
            return NULL;
        }
    }
    Py_ssize_t span = end > pos ? end - pos : 0;
    Py_ssize_t cap = count < 0 ? 0 : (Py_ssize_t)count;
    if (cap > span / MIN_RECORD_BYTES + 1)
        cap = span / MIN_RECORD_BYTES + 1; /* more would be truncated anyway */
    Py_ssize_t kdata0 = PyByteArray_GET_SIZE(cols[3]);
    Py_ssize_t vdata0 = PyByteArray_GET_SIZE(cols[6]);
    if (grow(cols[0], 8 * cap) < 0 || grow(cols[1], 8 * cap) < 0 || grow(cols[2], 4 * cap) < 0 ||
        grow(cols[3], span) < 0 || grow(cols[5], 4 * cap) < 0 || grow(cols[6], span) < 0 ||
        PyByteArray_Resize(cols[4], (rows0 + cap + 7) / 8) < 0 ||
        PyByteArray_Resize(cols[7], (rows0 + cap + 7) / 8) < 0)
        return NULL;
    /* Bits past the rows written stay 0: both decoders write the same bytes. */
    Py_ssize_t bitmap0 = (rows0 + 7) / 8, bitmap1 = (rows0 + cap + 7) / 8;
    memset(PyByteArray_AS_STRING(cols[4]) + bitmap0, 0, (size_t)(bitmap1 - bitmap0));
    memset(PyByteArray_AS_STRING(cols[7]) + bitmap0, 0, (size_t)(bitmap1 - bitmap0));
    Py_ssize_t hcap = 0, hkdata0 = 0, hvdata0 = 0;
    if (with_headers) {
        hcap = span / MIN_HEADER_BYTES + 1;
        hkdata0 = PyByteArray_GET_SIZE(cols[11]);
        hvdata0 = PyByteArray_GET_SIZE(cols[13]);
        Py_ssize_t hbitmap0 = (hrows0 + 7) / 8, hbitmap1 = (hrows0 + hcap + 7) / 8;
        if (grow(cols[8], 4 * cap) < 0 || PyByteArray_Resize(cols[9], bitmap1) < 0 ||
            grow(cols[10], 4 * hcap) < 0 || grow(cols[11], span) < 0 ||
            grow(cols[12], 4 * hcap) < 0 || grow(cols[13], span) < 0 ||
            PyByteArray_Resize(cols[14], hbitmap1) < 0)
            return NULL;
        memset(PyByteArray_AS_STRING(cols[9]) + bitmap0, 0, (size_t)(bitmap1 - bitmap0));
        memset(PyByteArray_AS_STRING(cols[14]) + hbitmap0, 0, (size_t)(hbitmap1 - hbitmap0));
    }
    struct col_loop L = {
        .buf = buf,
        .pos = pos,
        .end = end,
        .count = count,
        .base_offset = base_offset,
        .base_ts = base_ts,
        .min_offset = min_offset,
        .append_ts = append_ts,
        .use_append_ts = use_append_ts,
        .cap = cap,
        .offsets = PyByteArray_AS_STRING(cols[0]),
        .stamps = PyByteArray_AS_STRING(cols[1]),
        .koffs = PyByteArray_AS_STRING(cols[2]),
        .kdata = PyByteArray_AS_STRING(cols[3]),
        .kvalid = (unsigned char *)PyByteArray_AS_STRING(cols[4]),
        .voffs = PyByteArray_AS_STRING(cols[5]),
        .vdata = PyByteArray_AS_STRING(cols[6]),
        .vvalid = (unsigned char *)PyByteArray_AS_STRING(cols[7]),
        .with_headers = with_headers,
        .hcap = hcap,
        .row = rows0,
        .klen_total = kdata0,
        .vlen_total = vdata0,
        .hrow = hrows0,
        .hklen_total = hkdata0,
        .hvlen_total = hvdata0,
    };
    if (with_headers) {
        L.hoffs = PyByteArray_AS_STRING(cols[8]);
        L.hvalid = (unsigned char *)PyByteArray_AS_STRING(cols[9]);
        L.hkoffs = PyByteArray_AS_STRING(cols[10]);
        L.hkdata = PyByteArray_AS_STRING(cols[11]);
        L.hvoffs = PyByteArray_AS_STRING(cols[12]);
        L.hvdata = PyByteArray_AS_STRING(cols[13]);
        L.hvvalid = (unsigned char *)PyByteArray_AS_STRING(cols[14]);
    }
    if (span >= release_gil_bytes) {
        /* An export on each column keeps another thread from resizing (moving) it while
         * the GIL is released: a resize raises BufferError instead. The input buffer is
         * held by the caller's reference (bytes) or by over_buffer's export. */
        Py_buffer views[N_COLS_HEADERS];
        int held = 0;
        for (; held < n_cols; held++)
            if (PyObject_GetBuffer(cols[held], &views[held], PyBUF_WRITABLE) < 0)
                break;
        if (held == n_cols) {
            Py_BEGIN_ALLOW_THREADS
            columns_loop(&L);
            Py_END_ALLOW_THREADS
        }
        for (int c = 0; c < held; c++)
            PyBuffer_Release(&views[c]);
        if (held != n_cols)
            return NULL;
    }
    else
        columns_loop(&L);

    /* Cut every column back to the rows written (on error too: the caller discards). */
    Py_ssize_t n = L.row;
    int cut = PyByteArray_Resize(cols[0], 8 * n) < 0 || PyByteArray_Resize(cols[1], 8 * n) < 0 ||
              PyByteArray_Resize(cols[2], 4 * (n + 1)) < 0 ||
              PyByteArray_Resize(cols[3], L.klen_total) < 0 ||
              PyByteArray_Resize(cols[4], (n + 7) / 8) < 0 ||
              PyByteArray_Resize(cols[5], 4 * (n + 1)) < 0 ||
              PyByteArray_Resize(cols[6], L.vlen_total) < 0 ||
              PyByteArray_Resize(cols[7], (n + 7) / 8) < 0;
    if (with_headers) {
        Py_ssize_t hn = L.hrow;
        cut = cut || PyByteArray_Resize(cols[8], 4 * (n + 1)) < 0 ||
              PyByteArray_Resize(cols[9], (n + 7) / 8) < 0 ||
              PyByteArray_Resize(cols[10], 4 * (hn + 1)) < 0 ||
              PyByteArray_Resize(cols[11], L.hklen_total) < 0 ||
              PyByteArray_Resize(cols[12], 4 * (hn + 1)) < 0 ||
              PyByteArray_Resize(cols[13], L.hvlen_total) < 0 ||
              PyByteArray_Resize(cols[14], (hn + 7) / 8) < 0;
    }
    if (L.error != COL_OK) {
        if (cut)
            PyErr_Clear(); /* the corrupt input is the error to report */
        raise_col_error(&L, topic, partition);
        return NULL;
    }
    if (cut)
        return NULL;
    return Py_BuildValue("nLL", n - rows0, L.key_nulls, L.value_nulls);
}

PyDoc_STRVAR(set_release_gil_bytes_doc,
"set_release_gil_bytes(n)\n"
"--\n\n"
"decode_batch_columns releases the GIL for batches of n bytes or more; returns the\n"
"previous value (tests set 0 to run that path on small batches).");

/* A size argument: -1 with an exception set unless it is an int >= 0. */
static Py_ssize_t
size_arg(PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return -1;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "n must not be negative");
        return -1;
    }
    return n;
}

static PyObject *
set_release_gil_bytes(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_ssize_t n = size_arg(arg);
    if (n < 0)
        return NULL;
    Py_ssize_t old = release_gil_bytes;
    release_gil_bytes = n;
    return PyLong_FromSsize_t(old);
}

static PyObject *
decode_batch_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 11) {
        PyErr_Format(PyExc_TypeError, "decode_batch_columns expects 11 arguments, got %zd",
                     nargs);
        return NULL;
    }
    return over_buffer(args, columns_in);
}

PyDoc_STRVAR(unfilled_bytearray_doc,
"unfilled_bytearray(n, huge_pages=True) -> bytearray of n bytes whose contents are not set:\n"
"for a buffer the caller fills completely before reading it (a Fetch frame read off a socket),\n"
"without bytearray(n)'s zeroing of every byte first; with huge_pages, from 8 MiB on Linux,\n"
"backed by transparent huge pages where the system grants them.");

/* Transparent huge pages for the aligned part of a buffer at least this large. */
#define HUGE_PAGE_BYTES ((uintptr_t)2 * 1024 * 1024)
#define HUGE_PAGE_MIN_BUFFER (8 * 1024 * 1024)

static PyObject *
unfilled_bytearray(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *arg;
    int huge_pages = 1;
    if (!PyArg_ParseTuple(args, "O|p:unfilled_bytearray", &arg, &huge_pages))
        return NULL;
    Py_ssize_t n = size_arg(arg);
    if (n < 0)
        return NULL;
    PyObject *buf = PyByteArray_FromStringAndSize(NULL, n);
#ifdef MADV_HUGEPAGE
    /* A large frame's buffer is mostly fresh memory from the system, faulted in page by
       page as the socket fills it: 4 KiB pages cost about 28 ms per 50 MiB on the
       measuring machine, 2 MiB ones about 8 ms. Asked before any page is touched; where
       the system leaves huge pages to madvise (a common default), this is what gets them.
       A refusal only leaves the small pages. The price is paid at the fault: where the
       system compacts memory for the asker (defrag "madvise", a common default), one
       fault of a fragmented machine's 2 MiB page took 9 ms on the measuring machine,
       inside one recv: a reader that bounds each read's time asks for small pages. */
    if (buf != NULL && huge_pages && n >= HUGE_PAGE_MIN_BUFFER) {
        uintptr_t start = (uintptr_t)PyByteArray_AS_STRING(buf);
        uintptr_t first = (start + HUGE_PAGE_BYTES - 1) & ~(HUGE_PAGE_BYTES - 1);
        uintptr_t last = (start + (uintptr_t)n) & ~(HUGE_PAGE_BYTES - 1);
        if (last > first)
            (void)madvise((void *)first, (size_t)(last - first), MADV_HUGEPAGE);
    }
#endif
    return buf;
}

PyDoc_STRVAR(fetch_end_doc,
"fetch_end(data) -> (next_offset, last_epoch), None, or NotImplemented: records.fetch_end's\n"
"walk over the v2 batch headers of a Fetch answer's records, in C (a Python step per batch\n"
"cost 2.8 ms per MiB of one-record batches of 100 B). NotImplemented when next_offset would not\n"
"fit 64 bits: the caller's Python walk answers then.");

/* Batch header fields: baseOffset, batchLength, partitionLeaderEpoch, magic, lastOffsetDelta. */
#define END_HEADER_SIZE 61
#define END_LOG_OVERHEAD 12
#define END_EPOCH_AT 12
#define END_MAGIC_AT 16
#define END_LAST_DELTA_AT 23

static int64_t
be_i64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return (int64_t)v;
}

static int32_t
be_i32(const unsigned char *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}

/*
 * The v2 batch at data[pos:]: 1 and its end in *end when it is whole, 0 at the end of the
 * data or a partial batch (as the decoder skips it), -1 for a legacy message set or a header
 * that does not parse. Both header walks (fetch_end, batch_cuts) step with it.
 */
static int
whole_batch(const unsigned char *data, Py_ssize_t total, Py_ssize_t pos, Py_ssize_t *end)
{
    if (pos + END_HEADER_SIZE > total)
        return 0;
    const unsigned char *h = data + pos;
    int64_t length = be_i32(h + 8);
    if ((signed char)h[END_MAGIC_AT] != 2 || length + END_LOG_OVERHEAD < END_HEADER_SIZE)
        return -1;
    if (length > (int64_t)(total - pos - END_LOG_OVERHEAD))
        return 0;
    *end = pos + END_LOG_OVERHEAD + (Py_ssize_t)length;
    return 1;
}

static PyObject *
fetch_end(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *data = (const unsigned char *)view.buf;
    Py_ssize_t total = view.len, pos = 0;
    int found = 0, has_epoch = 0, overflow = 0;
    int64_t next_offset = 0;
    int32_t last_epoch = 0;
    Py_ssize_t end;
    int step;
    while ((step = whole_batch(data, total, pos, &end)) > 0) {
        const unsigned char *h = data + pos;
        int64_t base = be_i64(h);
        int64_t delta = be_i32(h + END_LAST_DELTA_AT);
        if (__builtin_add_overflow(base, delta, &next_offset) ||
            __builtin_add_overflow(next_offset, (int64_t)1, &next_offset)) {
            overflow = 1;
            break;
        }
        found = 1;
        int32_t epoch = be_i32(h + END_EPOCH_AT);
        if (epoch >= 0) {
            last_epoch = epoch;
            has_epoch = 1;
        }
        pos = end;
    }
    PyBuffer_Release(&view);
    if (overflow)
        Py_RETURN_NOTIMPLEMENTED;
    if (step < 0 || !found) /* a legacy message set, or no whole batch */
        Py_RETURN_NONE;
    if (has_epoch)
        return Py_BuildValue("(Li)", (long long)next_offset, (int)last_epoch);
    return Py_BuildValue("(LO)", (long long)next_offset, Py_None);
}

PyDoc_STRVAR(batch_cuts_doc,
"batch_cuts(data, max_records, max_bytes) -> list of (end, records), or None: where to cut a\n"
"Fetch answer's records into pieces of whole v2 batches, each of at most max_records records\n"
"and max_bytes bytes (or one batch, when a batch alone passes them): the end of each piece,\n"
"the last one the end of the last complete batch, with the records its batch headers count.\n"
"None when the data holds no complete batch or a legacy one (or a header that does not\n"
"parse): decoded whole then.");

/* Batch header: recordsCount, after baseSequence. */
#define CUTS_COUNT_AT 57

static int
append_cut(PyObject *cuts, Py_ssize_t end, Py_ssize_t records)
{
    PyObject *cut = Py_BuildValue("(nn)", end, records);
    if (cut == NULL)
        return -1;
    int ok = PyList_Append(cuts, cut);
    Py_DECREF(cut);
    return ok;
}

static PyObject *
batch_cuts(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *arg;
    Py_ssize_t max_records, max_bytes;
    if (!PyArg_ParseTuple(args, "Onn:batch_cuts", &arg, &max_records, &max_bytes))
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *data = (const unsigned char *)view.buf;
    Py_ssize_t total = view.len, pos = 0, piece_start = 0, piece_records = 0;
    PyObject *cuts = PyList_New(0);
    if (cuts == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t end;
    int step;
    while ((step = whole_batch(data, total, pos, &end)) > 0) {
        int64_t count = be_i32(data + pos + CUTS_COUNT_AT);
        /* This batch starts a new piece when the piece so far is full with it. */
        if (pos > piece_start &&
            (piece_records + count > max_records || end - piece_start > max_bytes)) {
            if (append_cut(cuts, pos, piece_records) < 0) {
                Py_DECREF(cuts);
                PyBuffer_Release(&view);
                return NULL;
            }
            piece_start = pos;
            piece_records = 0;
        }
        piece_records += count > 0 ? count : 0;
        pos = end;
    }
    PyBuffer_Release(&view);
    if (step < 0 || pos == 0) {
        Py_DECREF(cuts);
        Py_RETURN_NONE;
    }
    if (append_cut(cuts, pos, piece_records) < 0) {
        Py_DECREF(cuts);
        return NULL;
    }
    return cuts;
}

static PyMethodDef methods[] = {
    {"decode_batch_records", (PyCFunction)(void (*)(void))decode_batch_records, METH_FASTCALL,
     decode_batch_records_doc},
    {"decode_batch_columns", (PyCFunction)(void (*)(void))decode_batch_columns, METH_FASTCALL,
     decode_batch_columns_doc},
    {"set_release_gil_bytes", set_release_gil_bytes, METH_O, set_release_gil_bytes_doc},
    {"unfilled_bytearray", unfilled_bytearray, METH_VARARGS, unfilled_bytearray_doc},
    {"fetch_end", fetch_end, METH_O, fetch_end_doc},
    {"batch_cuts", batch_cuts, METH_VARARGS, batch_cuts_doc},
    {NULL, NULL, 0, NULL},
};

static int
exec_module(PyObject *module)
{
    (void)module;
    PyObject *errors = PyImport_ImportModule("epochguard.consumer.errors");
    if (errors == NULL)
        return -1;
    corrupt_error = PyObject_GetAttrString(errors, "CorruptRecordError");
    Py_DECREF(errors);
    if (corrupt_error == NULL)
        return -1;
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    "epochguard.consumer._crecords",
    "C decoder for the records of a Kafka v2 record batch (see records.py).",
    0,
    methods,
    slots,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__crecords(void)
{
    return PyModuleDef_Init(&moduledef);
}
