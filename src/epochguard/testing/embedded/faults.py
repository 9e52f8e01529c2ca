"""Fault injection for the embedded cluster, all in one place.

Rules are consulted on the loop thread: by the server (delays, dropped responses,
disconnects) and by handlers (injected error codes via :meth:`Faults.take_error`). Rule
methods are called from the test thread through ``EmbeddedCluster.faults``; a lock keeps the
counters consistent across the two threads.
"""

from __future__ import annotations

import threading

import attrs


@attrs.define
class _Rule:
    broker: int | None
    api_key: int | None
    remaining: int | None  # None: until cleared
    value: float | int = 0

    def matches(self, broker: int, api_key: int) -> bool:
        return (self.broker is None or self.broker == broker) and (
            self.api_key is None or self.api_key == api_key
        )


# A byte of the first v2 batch's CRC field (batch offsets 17..20).
_CRC_BYTE = 18


@attrs.define
class _Corruption:
    broker: int | None
    topic: str
    partition: int
    remaining: int | None  # None: until cleared
    garbage: bytes | None

    def matches(self, broker: int, topic: str, partition: int) -> bool:
        return (
            (self.broker is None or self.broker == broker)
            and self.topic == topic
            and self.partition == partition
        )


class Faults:
    """Injected misbehaviour. ``broker``/``api_key`` of None match every broker/API."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: list[_Rule] = []
        self._delays: list[_Rule] = []
        self._holds: list[_Rule] = []
        self._drops: list[_Rule] = []
        self._disconnects: list[_Rule] = []
        self._metadata_delays: dict[int, float] = {}
        self._corruptions: list[_Corruption] = []

    # -- configuring (test thread) ---------------------------------------------------------

    def inject_error(
        self, api_key: int, error_code: int, count: int = 1, broker: int | None = None
    ) -> None:
        """Answer the next ``count`` requests of ``api_key`` with ``error_code``.

        Partition-level APIs put the code on every partition of the response;
        REBOOTSTRAP_REQUIRED (129) on Metadata is the answer's top-level error (v13+).
        """
        with self._lock:
            self._errors.append(_Rule(broker, api_key, count, error_code))

    def delay_responses(
        self,
        seconds: float,
        api_key: int | None = None,
        broker: int | None = None,
        count: int | None = None,
    ) -> None:
        """Hold responses for ``seconds`` before sending them."""
        with self._lock:
            self._delays.append(_Rule(broker, api_key, count, seconds))

    def hold_requests(
        self,
        seconds: float,
        api_key: int | None = None,
        broker: int | None = None,
        count: int | None = 1,
    ) -> None:
        """Hold requests ``seconds`` before handling them, as a slow network delivers them:
        a request whose client gave up and closed the connection meanwhile is still handled
        (its answer goes nowhere). Later requests on that connection wait behind it."""
        with self._lock:
            self._holds.append(_Rule(broker, api_key, count, seconds))

    def drop_responses(
        self, api_key: int | None = None, broker: int | None = None, count: int | None = 1
    ) -> None:
        """Handle requests but never send their responses (the client times out)."""
        with self._lock:
            self._drops.append(_Rule(broker, api_key, count))

    def disconnect_on(
        self, api_key: int | None = None, broker: int | None = None, count: int | None = 1
    ) -> None:
        """Close the connection instead of answering."""
        with self._lock:
            self._disconnects.append(_Rule(broker, api_key, count))

    def corrupt_fetches(
        self,
        topic: str,
        partition: int,
        count: int | None = None,
        broker: int | None = None,
        garbage: bytes | None = None,
    ) -> None:
        """Serve damaged record bytes for ``topic``/``partition`` in the next ``count`` Fetch
        answers that carry records (None: until cleared).

        By default one byte of the first batch's CRC is flipped (what a bad disk or a bug
        in a proxy produces); with ``garbage`` those bytes replace the records instead. The
        stored log is untouched: clearing the rule serves the good bytes again.
        """
        with self._lock:
            self._corruptions.append(_Corruption(broker, topic, partition, count, garbage))

    def set_metadata_delay(self, broker: int, seconds: float) -> None:
        """``broker`` learns controller changes ``seconds`` late (0: at once).

        Until it learns, it keeps serving its old view: a stale leader answers as leader of
        the old epoch, a stale follower does not follow the new leader.
        """
        with self._lock:
            if seconds > 0:
                self._metadata_delays[broker] = seconds
            else:
                self._metadata_delays.pop(broker, None)

    def clear(self) -> None:
        with self._lock:
            self._metadata_delays.clear()
            self._errors.clear()
            self._delays.clear()
            self._holds.clear()
            self._drops.clear()
            self._disconnects.clear()
            self._corruptions.clear()

    # -- consulting (loop thread) ----------------------------------------------------------

    @staticmethod
    def _take(rules: list[_Rule], broker: int, api_key: int) -> _Rule | None:
        for rule in rules:
            if rule.matches(broker, api_key):
                if rule.remaining is not None:
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        rules.remove(rule)
                return rule
        return None

    def metadata_delay(self, broker: int) -> float:
        with self._lock:
            return self._metadata_delays.get(broker, 0.0)

    def take_error(self, broker: int, api_key: int) -> int:
        """The error code to inject into this request, 0 for none."""
        with self._lock:
            rule = self._take(self._errors, broker, api_key)
        return 0 if rule is None else int(rule.value)

    def take_delay(self, broker: int, api_key: int) -> float:
        with self._lock:
            rule = self._take(self._delays, broker, api_key)
        return 0.0 if rule is None else float(rule.value)

    def take_hold(self, broker: int, api_key: int) -> float:
        if not self._holds:
            return 0.0  # the common case, without taking the lock
        with self._lock:
            rule = self._take(self._holds, broker, api_key)
        return 0.0 if rule is None else float(rule.value)

    def take_drop(self, broker: int, api_key: int) -> bool:
        with self._lock:
            return self._take(self._drops, broker, api_key) is not None

    def corrupts(self, broker: int, topic: str, partition: int) -> bool:
        """Whether a :meth:`corrupt_fetches` rule would damage this partition's records."""
        if not self._corruptions:
            return False  # the common case, without taking the lock
        with self._lock:
            return any(rule.matches(broker, topic, partition) for rule in self._corruptions)

    def corrupt_records(self, broker: int, topic: str, partition: int, records: bytes) -> bytes:
        """The record bytes to serve for one partition of a Fetch answer (``records``
        itself unless a :meth:`corrupt_fetches` rule matches)."""
        if not records:
            return records
        with self._lock:
            for rule in self._corruptions:
                if rule.matches(broker, topic, partition):
                    if rule.remaining is not None:
                        rule.remaining -= 1
                        if rule.remaining <= 0:
                            self._corruptions.remove(rule)
                    if rule.garbage is not None:
                        return rule.garbage
                    damaged = bytearray(records)
                    if len(damaged) > _CRC_BYTE:
                        damaged[_CRC_BYTE] ^= 0xFF
                    return bytes(damaged)
        return records

    def take_disconnect(self, broker: int, api_key: int) -> bool:
        with self._lock:
            return self._take(self._disconnects, broker, api_key) is not None
