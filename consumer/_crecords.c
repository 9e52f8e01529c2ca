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
 * Take a record whose key and value are atomic (bytes or None without deserializers; str,
 * int, float, bool from one) out of the cyclic GC. Such a record cannot be part of a
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
untrack(PyObject *rec, PyObject *headers)
{
    Py_ssize_t n = PyList_GET_SIZE(headers);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(headers, i);
        if (PyObject_GC_IsTracked(pair))
            PyObject_GC_UnTrack(pair);
    }
    PyObject_GC_UnTrack(headers);
    PyObject_GC_UnTrack(rec);
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
            PyObject *ks = PyLong_FromLongLong(klen);
            PyObject *vs = PyLong_FromLongLong(vlen);
            PyObject *hs = PyLong_FromLongLong(hsize);
            rec = cls->tp_alloc(cls, N_FIELDS);
            if (ks == NULL || vs == NULL || hs == NULL || rec == NULL) {
                Py_DECREF(offset_obj);
                Py_DECREF(ts_obj);
                Py_XDECREF(ks);
                Py_XDECREF(vs);
                Py_XDECREF(hs);
                Py_XDECREF(rec);
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
                untrack(rec, headers);
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
                     "%U-%S: the batch at offset %lld has %zd bytes after its %lld records",
                     topic, partition, base_offset, end - pos, count);
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

static PyObject *
decode_batch_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 16) {
        PyErr_Format(PyExc_TypeError, "decode_batch_records expects 16 arguments, got %zd",
                     nargs);
        return NULL;
    }
    PyObject *data = args[0];
    if (PyBytes_CheckExact(data))
        return decode_in(args, (const unsigned char *)PyBytes_AS_STRING(data),
                         PyBytes_GET_SIZE(data));
    /* A memoryview into a Fetch response frame (the lean response path): decoded in place,
       so the records section is never copied before its keys and values are. */
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "buf must be bytes or a contiguous byte buffer");
        return NULL;
    }
    PyObject *result = decode_in(args, (const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"decode_batch_records", (PyCFunction)(void (*)(void))decode_batch_records, METH_FASTCALL,
     decode_batch_records_doc},
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
