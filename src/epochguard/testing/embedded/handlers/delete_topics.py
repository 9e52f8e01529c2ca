"""DeleteTopics v1-v6 (v6 by name or topic id). A recreated topic gets a new topic id."""

from __future__ import annotations

import uuid
from typing import Any

from kafka.protocol.admin import DeleteTopicsRequest, DeleteTopicsResponse

from epochguard._errors import ErrorCode
from epochguard.testing.embedded.handlers import RequestContext, handler

ZERO_UUID = uuid.UUID(int=0)


@handler(DeleteTopicsRequest, DeleteTopicsResponse, 1, 6)
async def handle(ctx: RequestContext, request: Any) -> Any:
    R = DeleteTopicsResponse
    v = ctx.version
    cluster = ctx.cluster
    injected = ctx.injected_error()
    wanted: list[tuple[str | None, uuid.UUID | None]]
    if v >= 6:
        wanted = [(t.name, t.topic_id if t.topic_id != ZERO_UUID else None) for t in request.topics]
    else:
        wanted = [(name, None) for name in request.topic_names]
    results = []
    for name, tid in wanted:
        error = injected
        if not error:
            if name is None and tid is not None:
                found = [t.name for t in cluster.topics.values() if t.topic_id == tid]
                name = found[0] if found else None
                if name is None:
                    error = ErrorCode.UNKNOWN_TOPIC_ID
            elif name not in cluster.topics:
                error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if not error and name is not None:
            tid = cluster.topics[name].topic_id
            if cluster.controller_available:
                cluster.delete_topic(name)
            else:
                error = ErrorCode.REQUEST_TIMED_OUT
        result = R.DeletableTopicResult(version=v, name=name, error_code=error, error_message=None)
        if v >= 6:
            result.topic_id = tid or ZERO_UUID
        results.append(result)
    return R(version=v, throttle_time_ms=0, responses=results)
