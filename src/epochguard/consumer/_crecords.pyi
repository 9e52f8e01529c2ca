from typing import Any

def decode_batch_records(
    buf: bytes | bytearray | memoryview,
    pos: int,
    end: int,
    count: int,
    topic: str,
    partition: int,
    epoch: int,
    base_offset: int,
    base_ts: int,
    ts_type: int,
    log_append_ts: int | None,
    min_offset: int,
    out: list[Any],
    key_des: Any,
    value_des: Any,
    record_cls: type[tuple[Any, ...]],
    /,
) -> None: ...
def decode_batch_columns(
    buf: bytes | bytearray | memoryview,
    pos: int,
    end: int,
    count: int,
    topic: str,
    partition: int,
    base_offset: int,
    base_ts: int,
    log_append_ts: int | None,
    min_offset: int,
    cols: list[bytearray],
    /,
) -> tuple[int, int, int]: ...
def set_release_gil_bytes(n: int, /) -> int: ...
def unfilled_bytearray(n: int, huge_pages: bool = True, /) -> bytearray: ...
def batch_cuts(data: Any, max_records: int, max_bytes: int, /) -> list[tuple[int, int]] | None: ...
