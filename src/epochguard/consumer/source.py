"""One broker's side of fetching (franz-go's ``source``): the decoded records of the
partitions fetched from it that the application has not taken yet, which of them reached the
high watermark, the prefetches sent ahead of the trackers, the count of fetch requests in
flight to it, and its fetch session (``session.py``).

The partitions' cursors are their trackers (``PartitionTracker``: position, epochs, leader),
which stay the only place for decisions; a source only holds what was fetched for them and
never changes a position. The driver (:class:`~epochguard.consumer.fetcher.Fetcher`) owns
one source per broker it fetches from.
"""

from __future__ import annotations

import collections
from typing import Any

from kafka.structs import TopicPartition

from epochguard.consumer import wire
from epochguard.consumer.records import ConsumerRecord
from epochguard.consumer.session import FetchSession
from epochguard.offsets.events import FetchAction

__all__ = ["MAX_FETCHES_PER_BROKER", "Buffered", "Prefetch", "Source"]

#: Fetch requests in flight per broker. Measured: a second one does not help once requests
#: holding only caught-up partitions are deferred (see ``Fetcher.send_requests``).
MAX_FETCHES_PER_BROKER = 1


class Buffered:
    """Decoded records of one partition not yet handed to the application."""

    __slots__ = (
        "action",
        "ahead",
        "last_epoch",
        "last_record_epoch",
        "next_offset",
        "pos",
        "records",
        "rest",
        "rest_epoch",
        "rest_offset",
        "rest_records",
    )

    def __init__(
        self,
        action: FetchAction,
        records: list[ConsumerRecord],
        next_offset: int,
        last_epoch: int | None,
    ) -> None:
        self.action = action
        self.records = records
        self.pos = 0
        #: where the whole answer ends, and the leader epoch of its last batch
        self.next_offset = next_offset
        self.last_epoch = last_epoch
        #: The answer's pieces still to decode, each with the records its batch headers
        #: count (``Fetcher.fetched_records`` decodes the next when the records run out),
        #: or ``None``: all decoded; ``rest_records`` is their sum.
        self.rest: collections.deque[tuple[Any, int]] | None = None
        self.rest_records = 0
        #: With ``rest``: the offset the next piece's records start from, the epoch of the
        #: last batch decoded, of the last record decoded, and the answer's early prefetch
        #: (checked once the whole answer is decoded).
        self.rest_offset = 0
        self.rest_epoch: int | None = None
        self.last_record_epoch: int | None = None
        self.ahead: Prefetch | None = None


class Prefetch:
    """A fetch sent before the tracker asked for it: the request the tracker will make once
    the application has drained the partition's buffer. It is only used as the answer to a
    tracker ``FetchAction`` asking for exactly the same thing (same leader, offset, current
    leader epoch and last fetched epoch); otherwise it is thrown away. The tracker still
    sees one answer per request it made, so it keeps every decision."""

    __slots__ = ("after", "answer", "entry", "node", "waiting")

    def __init__(self, node: int, entry: wire.FetchEntry) -> None:
        self.node = node
        self.entry = entry
        #: The partition's part of the answer, once it arrived (and nobody waited for it).
        self.answer: wire.FetchedPartition | None = None
        self.waiting: FetchAction | None = None
        #: The prefetch of what follows this one's answer, sent once that answer arrived
        #: (before the tracker asked for it): it takes this one's place when this one is
        #: used, and goes with it when this one is dropped.
        self.after: Prefetch | None = None

    def matches(self, action: FetchAction) -> bool:
        e = self.entry
        return (
            action.node_id == self.node
            and action.offset == e.offset
            and action.current_leader_epoch == e.current_leader_epoch
            and action.last_fetched_epoch == e.last_fetched_epoch
            and action.topic_id == e.topic_id
        )


class Source:
    """What is fetched from one broker and not yet delivered."""

    __slots__ = (
        "buffers",
        "caught_up",
        "in_flight",
        "node",
        "prefetches",
        "session",
        "undecoded",
        "unprefetched",
    )

    def __init__(self, node: int, sessions: bool = True) -> None:
        self.node = node
        #: The KIP-227 fetch session of the tracker fetches (prefetches stay sessionless:
        #: they name other partitions, and would churn the session back and forth).
        self.session = FetchSession(node, sessions)
        self.in_flight = 0
        self.buffers: dict[TopicPartition, Buffered] = {}
        #: partitions whose last fetch from this broker reached the high watermark
        self.caught_up: dict[TopicPartition, bool] = {}
        self.prefetches: dict[TopicPartition, Prefetch] = {}
        #: buffered partitions not yet looked at for a prefetch (``prefetch_entries`` looks
        #: at each buffer once, not at every buffer on every poll)
        self.unprefetched: dict[TopicPartition, None] = {}
        #: partitions of this broker's answers with records still to decode (the fetcher's
        #: decode budget): records on their way into the buffers
        self.undecoded = 0

    @property
    def holds_records(self) -> bool:
        """Records of this broker not yet delivered: buffered, or still to be decoded."""
        return bool(self.buffers) or self.undecoded > 0

    @property
    def can_send(self) -> bool:
        return self.in_flight < MAX_FETCHES_PER_BROKER

    def request_sent(self) -> None:
        self.in_flight += 1

    def request_done(self) -> None:
        if self.in_flight > 0:
            self.in_flight -= 1

    def all_caught_up(self, actions: list[FetchAction]) -> bool:
        caught_up = self.caught_up
        return all(caught_up.get(a.tp, False) for a in actions)

    def add_buffer(self, tp: TopicPartition, buffered: Buffered) -> None:
        self.buffers[tp] = buffered
        self.unprefetched[tp] = None

    def drop(self, tp: TopicPartition) -> bool:
        """Forget ``tp``'s buffer, flag and prefetch; True if a prefetch was discarded."""
        self.buffers.pop(tp, None)
        self.unprefetched.pop(tp, None)
        self.caught_up.pop(tp, None)
        return self.prefetches.pop(tp, None) is not None

    def prefetch_entries(
        self, cursors: dict[TopicPartition, Any], fetching: Any
    ) -> list[tuple[TopicPartition, Prefetch]]:
        """Prefetches for buffered partitions still fetching from this broker: what their
        trackers will ask for once the application has drained them. Only when no fetch is
        in flight to this broker, and not for partitions at the end of their log. Each buffer
        is considered once, the first time no fetch is in flight after it was filled."""
        if self.in_flight > 0 or not self.unprefetched:
            return []
        out: list[tuple[TopicPartition, Prefetch]] = []
        todo = self.unprefetched
        self.unprefetched = {}
        for tp in todo:
            buf = self.buffers.get(tp)
            if buf is None or tp in self.prefetches or self.caught_up.get(tp, False):
                continue
            if buf.rest is not None:
                # Its last record's epoch is not known until its last piece is decoded,
                # which puts it back here (Fetcher._decode_next_piece).
                continue
            tracker = cursors.get(tp)
            if tracker is None or tracker.state is not fetching or tracker.paused:
                continue
            if tracker.fetch_node != self.node:
                continue
            last = buf.records[-1].leader_epoch if buf.records else buf.last_epoch
            out.append((tp, self.prefetch(tp, tracker, buf.next_offset, last)))
        return out

    def prefetch(
        self, tp: TopicPartition, tracker: Any, offset: int, last_epoch: int | None
    ) -> Prefetch:
        """The fetch ``tracker`` will ask this broker for at ``offset`` once the records
        before it are delivered, ``last_epoch`` being the epoch of the last of them."""
        entry = wire.FetchEntry(
            tp,
            offset,
            tracker.leader_epoch,
            None if last_epoch is None or last_epoch < 0 else last_epoch,
            tracker.topic_id,
        )
        return Prefetch(self.node, entry)

    def may_prefetch_ahead(self, tp: TopicPartition, tracker: Any, fetching: Any) -> bool:
        """Whether a prefetch for ``tp`` may go out before its answer in hand is decoded:
        the conditions of :meth:`prefetch_entries`, checked while the tracker still awaits
        that answer."""
        return tp not in self.prefetches and self.may_chain(tracker, fetching)

    def may_chain(self, tracker: Any, fetching: Any) -> bool:
        """Whether a fetch may go out ahead of ``tracker``'s request: nothing in flight to
        this broker, and the tracker fetching from it, unpaused. A partition's stored
        prefetch answer may have one chained after it (``Prefetch.after``)."""
        return (
            self.in_flight == 0
            and tracker.state is fetching
            and not tracker.paused
            and tracker.fetch_node == self.node
        )
