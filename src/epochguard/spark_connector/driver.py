"""The driver's side of the Spark source: one EpochConsumer per query that lists partitions,
looks up start and end positions and validates them (OffsetForLeaderEpoch).

Imported on the first driver call, not with the data source: Spark's planner processes load
the data source only to create it and to pickle its readers, and need none of the consumer.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from kafka.errors import KafkaConnectionError, KafkaTimeoutError
from kafka.structs import TopicPartition

from epochguard._log import get_logger
from epochguard.consumer import EpochConsumer
from epochguard.consumer.client import FATAL_CONNECTION_ERRORS
from epochguard.offsets.position import EpochOffset
from epochguard.offsets.report import TruncationReport, records_count
from epochguard.spark_connector.errors import (
    SourceOptionError,
    SparkDataLossError,
    SparkLogTruncationError,
    SparkMissingTopicError,
    SparkUnreachableError,
    data_loss_message,
)
from epochguard.spark_connector.offsets import EARLIEST, LATEST
from epochguard.spark_connector.options import (
    Assign,
    EarliestOffsets,
    GlobalTimestamp,
    LatestOffsets,
    OffsetLimit,
    PartitionTimestamps,
    SourceOptions,
    Strategy,
    Subscribe,
)

__all__ = ["Driver", "connect", "in_leader_epoch", "truncation_message"]

log = get_logger("epochguard.spark_connector")


def truncation_message(report: TruncationReport, where: str) -> str:
    """The text after ``KAFKA_LOG_TRUNCATION:``: partition, divergence, lost range."""
    tp = f"{report.topic}-{report.partition}"
    if report.divergence is None:
        lost = f"divergence unknown, lost range [?, {report.lost_to})"
    else:
        lost = (
            f"divergence at {report.divergence}, lost range "
            f"[{report.lost_from}, {report.lost_to}) ({records_count(report.lost_count)})"
        )
    return f"topic {report.topic} partition {report.partition} ({tp}): {lost}; {where}"


#: What a consumer that cannot reach its cluster raises while bootstrapping.
UNREACHABLE_ERRORS = (KafkaConnectionError, KafkaTimeoutError, *FATAL_CONNECTION_ERRORS)


def connect(kw: Mapping[str, Any]) -> EpochConsumer:
    """A new EpochConsumer; a cluster it cannot reach is a :class:`SparkUnreachableError`
    with the bootstrap failure's own words (refused, timed out, authentication)."""
    try:
        return EpochConsumer(**kw)
    except UNREACHABLE_ERRORS as exc:
        reason = exc.args[0] if len(exc.args) == 1 else str(exc)
        raise SparkUnreachableError(str(reason)) from exc


class Driver:
    """The driver's Kafka client: partitions, start/end positions, validation."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._consumer: EpochConsumer | None = None
        # The last listing of the partitions read, and when it was made (monotonic).
        self._listed: tuple[float, list[TopicPartition]] | None = None

    @property
    def consumer(self) -> EpochConsumer:
        if self._consumer is None:
            kw = self.opts.consumer_kwargs()
            # The driver only lists offsets: keep the fetches it may send small.
            kw.setdefault("max_partition_fetch_bytes", 1024)
            self._consumer = connect(kw)
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close(autocommit=False)
            self._consumer = None

    def partitions(self) -> list[TopicPartition]:
        """The partitions the query reads, listed again from fresh metadata, except within
        ``retry_backoff_ms`` of the last listing: the consumer does not ask for metadata
        more often than that, so a second listing right after the first (Spark calls
        ``prepareForTriggerAvailableNow`` and then ``initialOffset``, each listing) waited
        out the backoff: 93 ms of every availableNow query in its progress."""
        strategy: Strategy = self.opts.strategy
        if isinstance(strategy, Assign):
            return sorted(strategy.partitions)
        c = self.consumer
        now = time.monotonic()
        if self._listed is not None and now - self._listed[0] < c.config["retry_backoff_ms"] / 1000:
            return list(self._listed[1])
        topics = (
            strategy.topics
            if isinstance(strategy, Subscribe)
            else sorted(t for t in c.topics() if strategy.matches(t))
        )
        out: list[TopicPartition] = []
        missing: list[str] = []
        for topic in topics:
            parts = c.partitions_for_topic(topic)
            if not parts:
                missing.append(topic)
                continue
            out.extend(TopicPartition(topic, p) for p in sorted(parts))
        if missing and isinstance(strategy, Subscribe):
            if self.opts.fail_on_missing_topic:
                raise SparkMissingTopicError(missing)
            for topic in missing:
                # At each listing (about once per batch) while it is missing: a query
                # reading nothing should say why.
                log.warning(
                    "kafka_missing_topic",
                    topic=topic,
                    reason="subscribed topic does not exist; read once it is created "
                    "(failOnMissingTopic=true fails the query instead)",
                )
        self._listed = (time.monotonic(), out)
        return list(out)

    def _assign(self, tps: Sequence[TopicPartition]) -> None:
        c = self.consumer
        if c.assignment() != set(tps):
            # Partitions assigned already keep their state, and a lookup in flight with it.
            c.assign(list(tps))

    def _request_positions(self, tps: Sequence[TopicPartition], end: bool) -> None:
        """Ask for the log end (or start) of assigned ``tps`` without waiting: the lookups
        go out with whatever the consumer sends next."""
        if not tps:
            return
        c = self.consumer
        # The driver reads no records. Unpaused, a partition at its log end has a Fetch
        # long-polling for fetch.max.wait.ms, and the broker answers the next lookup on that
        # connection only after it: latestOffset took 0.5 or 1.0 s in Spark's progress.
        c.pause(*tps)
        if end:
            c.seek_to_end(*tps)
        else:
            c.seek_to_beginning(*tps)

    def _positions(
        self,
        tps: Sequence[TopicPartition],
        end: bool,
        requested: Collection[TopicPartition] = (),
    ) -> dict[TopicPartition, EpochOffset]:
        """The log end (or start) of ``tps``; those in ``requested`` were asked for already
        (:meth:`_request_positions`) and are not asked again."""
        if not tps:
            return {}
        self._assign(tps)
        self._request_positions([tp for tp in tps if tp not in requested], end)
        timeout = self.opts.poll_timeout_ms
        return {tp: self.consumer.position_with_epoch(tp, timeout_ms=timeout) for tp in tps}

    def latest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, EpochOffset]:
        """Log end offsets, each with the leader's epoch (bounds every record before it)."""
        return self._positions(tps, end=True)

    def earliest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, EpochOffset]:
        return self._positions(tps, end=False)

    def latest_listed(self) -> dict[TopicPartition, EpochOffset]:
        """:meth:`latest` of the partitions :meth:`partitions` lists, in one round trip
        where the partitions are those of the last listing: their lookups go out with the
        listing's Metadata request, not after its answer. A partition the listing finds
        new is looked up after it."""
        known = [] if self._listed is None else self._listed[1]
        if known and not isinstance(self.opts.strategy, Assign):
            self._assign(known)
            self._request_positions(known, end=True)
        return self._positions(self.partitions(), end=True, requested=known)

    def resolve(
        self, limit: OffsetLimit, tps: Sequence[TopicPartition], prefix: str = "starting"
    ) -> dict[TopicPartition, EpochOffset]:
        """Starting or ending (``prefix``) positions for ``tps`` from an option's limit.

        Specific offsets: a partition the JSON does not name starts at the earliest offset
        (as a partition Spark's source discovers later does)."""
        if isinstance(limit, EarliestOffsets):
            return self.earliest(tps)
        if isinstance(limit, LatestOffsets):
            return self.latest(tps)
        if isinstance(limit, GlobalTimestamp | PartitionTimestamps):
            return self._by_timestamp(limit, tps, prefix)
        given = limit.as_dict()
        out: dict[TopicPartition, EpochOffset] = {}
        want_earliest = [tp for tp in tps if given.get(tp, EARLIEST) == EARLIEST]
        want_latest = [tp for tp in tps if given.get(tp) == LATEST]
        out.update(self.earliest(want_earliest))
        out.update(self.latest(want_latest))
        for tp in tps:
            pos = given.get(tp)
            if isinstance(pos, EpochOffset):
                out[tp] = pos
        return out

    def _by_timestamp(
        self,
        limit: GlobalTimestamp | PartitionTimestamps,
        tps: Sequence[TopicPartition],
        prefix: str,
    ) -> dict[TopicPartition, EpochOffset]:
        """The first offset at or after each timestamp, with the epoch of the record there
        (an upper bound for the record before it). No such record: the latest offset, or for
        a start with ``startingOffsetsByTimestampStrategy=error``, an error."""
        if isinstance(limit, GlobalTimestamp):
            option = f"{prefix}Timestamp"
            stamps = dict.fromkeys(tps, limit.timestamp)
        else:
            option = f"{prefix}OffsetsByTimestamp"
            stamps = limit.as_dict()
            missing = sorted(set(tps) - set(stamps))
            if missing:
                names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in missing)
                raise SourceOptionError(option, f"gives no timestamp for partitions {names}")
            stamps = {tp: stamps[tp] for tp in tps}
        out, no_match = self._at_times(stamps)
        if no_match and prefix == "starting" and self.opts.no_match_strategy == "error":
            names = ", ".join(f"{tp.topic}-{tp.partition}@{stamps[tp]}" for tp in no_match)
            raise SourceOptionError(
                option,
                f"no record at or after the timestamp in {names} (set "
                "startingOffsetsByTimestampStrategy=latest to start at the latest offset)",
            )
        out.update(self.latest(no_match))
        return out

    def first_at_time(
        self, timestamp_ms: int, tps: Sequence[TopicPartition]
    ) -> dict[TopicPartition, EpochOffset]:
        """The first offset at or after ``timestamp_ms`` in each of ``tps``, with the epoch
        of the record there, as :meth:`resolve` finds a starting timestamp; where no record
        is that late, the log end (nothing before it is)."""
        out, no_match = self._at_times(dict.fromkeys(tps, timestamp_ms))
        out.update(self.latest(no_match))
        return out

    def _at_times(
        self, stamps: Mapping[TopicPartition, int]
    ) -> tuple[dict[TopicPartition, EpochOffset], list[TopicPartition]]:
        """ListOffsets by time: per partition the first offset whose record is at or after
        its timestamp (ms), with that record's epoch (an upper bound for the record before
        it), and the partitions with no such record."""
        if not stamps:
            return {}, []
        found = self.consumer.offsets_for_times(dict(stamps), timeout_ms=self.opts.poll_timeout_ms)
        out: dict[TopicPartition, EpochOffset] = {}
        no_match: list[TopicPartition] = []
        for tp in stamps:
            hit = found.get(tp)
            if hit is None:
                no_match.append(tp)
            else:
                epoch = hit.leader_epoch if hit.leader_epoch is not None else -1
                out[tp] = EpochOffset(hit.offset, epoch if hit.offset > 0 else None)
        return out, no_match

    def validate(
        self,
        positions: Mapping[TopicPartition, EpochOffset],
        where: str,
        log_ends: Mapping[TopicPartition, EpochOffset] | None = None,
    ) -> dict[TopicPartition, EpochOffset]:
        """Check positions with OffsetForLeaderEpoch. A truncation fails (``fail``) or, with
        ``rewind`` and a known divergence point, is logged and that point returned, per
        partition; records removed by retention follow ``failOnDataLoss``.

        ``log_ends``: log end positions just looked up (:meth:`latest`). A position in the
        epoch of the leader that answered, at or before its log end, in the same topic, is
        valid without asking: a leader never truncates its log during its epoch, and
        OffsetForLeaderEpoch for that epoch would answer with its log end."""
        ends = log_ends or {}
        with_epochs = {
            tp: p
            for tp, p in positions.items()
            if p.leader_epoch is not None and not in_leader_epoch(p, ends.get(tp))
        }
        if not with_epochs:
            return {}
        results = self.consumer.validate_offsets(with_epochs, timeout_ms=self.opts.poll_timeout_ms)
        rewinds: dict[TopicPartition, EpochOffset] = {}
        for tp, res in sorted(results.items()):
            if res.valid:
                continue
            report = res.report
            if report is not None:
                if self.opts.on_truncation == "rewind" and report.divergence is not None:
                    log.warning(
                        "kafka_log_truncation", action="rewind", where=where, **report.to_dict()
                    )
                    rewinds[tp] = report.divergence
                    continue
                raise SparkLogTruncationError(truncation_message(report, where))
            detail = f"position {res.position} cannot be read ({res.error}); {where}"
            if self.opts.fail_on_data_loss:
                raise SparkDataLossError(data_loss_message(tp, detail))
            # The executor skips what retention removed.
            log.warning("kafka_data_loss", topic=tp.topic, partition=tp.partition, reason=detail)
        return rewinds


def in_leader_epoch(position: EpochOffset, log_end: EpochOffset | None) -> bool:
    """Whether ``position`` is in the epoch of the leader whose log end is ``log_end`` (the
    leader's epoch, as ListOffsets for the latest offset gives it), at or before that end."""
    return (
        log_end is not None
        and log_end.leader_epoch is not None
        and position.leader_epoch == log_end.leader_epoch
        and position.topic_id == log_end.topic_id
        and position.offset <= log_end.offset
    )
