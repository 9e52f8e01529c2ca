"""When to go back to the bootstrap servers (``metadata_recovery_strategy``).

Brokers can all move to new addresses while the bootstrap address stays (a Kubernetes
rollout behind one service name). A consumer that only knows the old addresses would try
them forever; Java's client (KIP-899, KIP-1102) and librdkafka instead *rebootstrap*: they
forget the brokers they learned, connect to the bootstrap servers again (resolving their
names anew) and take the brokers from that answer. :class:`MetadataRecovery` decides when,
given the time and what the connection layer knows; it never does I/O. The connection layer
(:class:`~epochguard.consumer.client.BrokerClient`) asks it before each request that may go
to any broker and tells it about metadata answers.

A rebootstrap is due when

- no broker learned from the last answer can be reached (each is down or backing off its
  reconnects), when a request needs one;
- no metadata answer arrived for ``metadata_recovery_rebootstrap_trigger_ms`` since the
  first attempt after the last answer (a broker that accepts connections but never
  answers);
- a Metadata answer carried the top-level error ``REBOOTSTRAP_REQUIRED`` (Metadata v13+).

Only the brokers' addresses are forgotten: partition positions, leader epochs, the group
membership and fetch sessions are the engine's and stay as they are.
"""

from __future__ import annotations

import enum

import attrs

__all__ = ["RECOVERY_STRATEGIES", "MetadataRecovery", "RebootstrapReason"]

#: ``metadata_recovery_strategy`` values (Java's ``metadata.recovery.strategy``).
RECOVERY_STRATEGIES = ("rebootstrap", "none")


class RebootstrapReason(enum.StrEnum):
    """Why a rebootstrap is due (the ``reason`` field of the ``rebootstrap`` log event)."""

    #: Every learned broker is down or backing off.
    NO_REACHABLE_BROKER = "no_reachable_broker"
    #: No metadata answer for ``metadata_recovery_rebootstrap_trigger_ms``.
    METADATA_TIMEOUT = "metadata_timeout"
    #: A broker answered Metadata with the top-level error REBOOTSTRAP_REQUIRED.
    REBOOTSTRAP_REQUIRED = "rebootstrap_required"


@attrs.define
class MetadataRecovery:
    """The rebootstrap decision and its state; every input carries ``now`` (seconds,
    ``time.monotonic()``)."""

    strategy: str
    trigger_s: float
    #: When the first metadata attempt since the last answer was made (``None``: none is
    #: outstanding).
    attempt_started: float | None = None
    #: A broker asked for a rebootstrap (REBOOTSTRAP_REQUIRED) and none was made since.
    required: bool = False
    #: After a rebootstrap, until a metadata answer names the brokers: requests that may go
    #: to any broker go to the bootstrap servers.
    rebootstrapping: bool = False
    #: Rebootstraps made so far.
    rebootstraps: int = 0

    @property
    def enabled(self) -> bool:
        return self.strategy == "rebootstrap"

    def on_metadata_sent(self, now: float) -> None:
        """A metadata request is going out."""
        if self.attempt_started is None:
            self.attempt_started = now

    def on_metadata_answer(self, now: float, *, rebootstrap_required: bool) -> None:
        """A metadata answer arrived; ``rebootstrap_required``: its top-level error was
        REBOOTSTRAP_REQUIRED (the answer names no brokers and counts as no answer)."""
        if rebootstrap_required:
            self.required = True
            return
        self.attempt_started = None
        self.required = False
        self.rebootstrapping = False

    def due(self, now: float, *, reachable: bool) -> RebootstrapReason | None:
        """Why a rebootstrap is due now, whatever the strategy (``None``: it is not).

        ``reachable``: some broker a request could go to now is connected or may be
        connected to (not backing off); while rebootstrapping, some bootstrap server."""
        if self.required:
            return RebootstrapReason.REBOOTSTRAP_REQUIRED
        # While rebootstrapping there is nothing learned left to forget: the bootstrap
        # servers' own reconnect backoff paces the attempts, until the trigger below.
        if not reachable and not self.rebootstrapping:
            return RebootstrapReason.NO_REACHABLE_BROKER
        started = self.attempt_started
        if started is not None and now - started > self.trigger_s:
            return RebootstrapReason.METADATA_TIMEOUT
        return None

    def decide(self, now: float, *, reachable: bool) -> RebootstrapReason | None:
        """The reason to rebootstrap now, or ``None`` (always ``None`` with strategy
        ``"none"``)."""
        if not self.enabled:
            return None
        return self.due(now, reachable=reachable)

    def on_rebootstrap(self, now: float) -> None:
        """A rebootstrap was made: ask the bootstrap servers, and give them the whole
        trigger interval to answer (as Java does)."""
        self.rebootstraps += 1
        self.required = False
        self.rebootstrapping = True
        self.attempt_started = now
