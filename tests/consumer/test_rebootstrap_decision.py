"""The rebootstrap decision (``MetadataRecovery``), fed times and what the connection layer
knows; its two configuration keys; the Metadata v13 top-level error as the wire layer reads
it."""

from __future__ import annotations

from types import SimpleNamespace as NS
from typing import Any

import pytest
from kafka.protocol.metadata import MetadataResponse

from epochguard._errors import ErrorCode
from epochguard.consumer import wire
from epochguard.consumer.config import DEFAULT_CONFIG, build_config
from epochguard.consumer.errors import ConsumerConfigError
from epochguard.consumer.rebootstrap import MetadataRecovery, RebootstrapReason

TRIGGER_S = 300.0


def recovery(strategy: str = "rebootstrap") -> MetadataRecovery:
    return MetadataRecovery(strategy, TRIGGER_S)


def test_nothing_is_due_while_a_broker_can_be_reached_and_metadata_answers() -> None:
    r = recovery()
    assert r.decide(0.0, reachable=True) is None
    r.on_metadata_sent(10.0)
    assert r.decide(10.0 + TRIGGER_S, reachable=True) is None  # not *more* than the trigger
    r.on_metadata_answer(11.0, rebootstrap_required=False)
    assert r.decide(10_000.0, reachable=True) is None  # answered: no attempt outstanding


def test_every_learned_broker_unreachable_rebootstraps_at_once() -> None:
    r = recovery()
    r.on_metadata_sent(5.0)
    assert r.decide(5.1, reachable=False) is RebootstrapReason.NO_REACHABLE_BROKER
    r.on_rebootstrap(5.1)
    assert r.rebootstrapping and r.rebootstraps == 1
    # Asking the bootstrap servers now: their backoff paces the next attempts, not more
    # rebootstraps (nothing learned is left to forget).
    assert r.decide(5.2, reachable=False) is None
    assert r.decide(6.0, reachable=True) is None
    # An answer names the brokers again: they are what an unreachable verdict is about.
    r.on_metadata_answer(6.5, rebootstrap_required=False)
    assert not r.rebootstrapping
    assert r.decide(7.0, reachable=False) is RebootstrapReason.NO_REACHABLE_BROKER


def test_no_answer_for_the_trigger_interval_rebootstraps() -> None:
    r = recovery()
    r.on_metadata_sent(100.0)
    r.on_metadata_sent(150.0)  # a retry does not restart the clock
    assert r.decide(100.0 + TRIGGER_S, reachable=True) is None
    assert r.decide(100.0 + TRIGGER_S + 0.001, reachable=True) is (
        RebootstrapReason.METADATA_TIMEOUT
    )
    r.on_rebootstrap(401.0)
    # The bootstrap servers get the whole interval too, then it is done again.
    assert r.decide(401.0 + TRIGGER_S, reachable=True) is None
    assert r.decide(401.0 + TRIGGER_S + 1, reachable=True) is RebootstrapReason.METADATA_TIMEOUT


def test_rebootstrap_required_answer_forces_one_rebootstrap() -> None:
    r = recovery()
    r.on_metadata_sent(1.0)
    r.on_metadata_answer(1.1, rebootstrap_required=True)
    # Counts as no answer: the clock keeps running, and the next request rebootstraps.
    assert r.attempt_started == 1.0
    assert r.decide(1.2, reachable=True) is RebootstrapReason.REBOOTSTRAP_REQUIRED
    r.on_rebootstrap(1.2)
    assert r.decide(1.3, reachable=True) is None
    r.on_metadata_answer(1.4, rebootstrap_required=False)
    assert r.decide(1.5, reachable=True) is None and r.rebootstraps == 1


def test_strategy_none_never_rebootstraps_but_knows_why_it_would() -> None:
    r = recovery("none")
    r.on_metadata_sent(0.0)
    r.on_metadata_answer(0.1, rebootstrap_required=True)
    assert r.decide(0.2, reachable=True) is None
    assert r.due(0.2, reachable=True) is RebootstrapReason.REBOOTSTRAP_REQUIRED
    r.on_metadata_answer(0.3, rebootstrap_required=False)
    assert r.due(0.4, reachable=False) is RebootstrapReason.NO_REACHABLE_BROKER
    assert r.decide(0.4, reachable=False) is None
    r.on_metadata_sent(1.0)
    assert r.due(1.0 + TRIGGER_S + 1, reachable=True) is RebootstrapReason.METADATA_TIMEOUT
    assert r.decide(1.0 + TRIGGER_S + 1, reachable=True) is None
    assert r.rebootstraps == 0


def test_zero_trigger_rebootstraps_on_any_metadata_wait() -> None:
    r = MetadataRecovery("rebootstrap", 0.0)
    r.on_metadata_sent(3.0)
    assert r.decide(3.0, reachable=True) is None
    assert r.decide(3.001, reachable=True) is RebootstrapReason.METADATA_TIMEOUT


# ----------------------------------------------------------------------------- configuration


def test_defaults_are_javas() -> None:
    assert DEFAULT_CONFIG["metadata_recovery_strategy"] == "rebootstrap"
    assert DEFAULT_CONFIG["metadata_recovery_rebootstrap_trigger_ms"] == 300000
    cfg = build_config({"metadata_recovery_strategy": "NONE"})
    assert cfg["metadata_recovery_strategy"] == "none"  # case-insensitive, as Java
    assert (
        build_config({"metadata_recovery_rebootstrap_trigger_ms": 0})[
            "metadata_recovery_rebootstrap_trigger_ms"
        ]
        == 0
    )


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("metadata_recovery_strategy", "re-bootstrap", "must be 'rebootstrap' or 'none'"),
        ("metadata_recovery_strategy", None, "must be 'rebootstrap' or 'none'"),
        ("metadata_recovery_rebootstrap_trigger_ms", -1, "must be >= 0"),
        ("metadata_recovery_rebootstrap_trigger_ms", 1.5, "must be an int"),
        ("metadata_recovery_rebootstrap_trigger_ms", True, "must be an int"),
    ],
)
def test_bad_values_name_the_key(key: str, value: Any, says: str) -> None:
    with pytest.raises(ConsumerConfigError) as info:
        build_config({key: value})
    assert info.value.key == key
    assert says in str(info.value)


def test_metadata_v13_is_the_highest_version_asked() -> None:
    assert build_config({})["max_metadata_version"] == 13
    with pytest.raises(ConsumerConfigError, match="must be <= 13"):
        build_config({"max_metadata_version": 14})


# ----------------------------------------------------------------------------- wire


def _response(version: int, error_code: int = 0) -> Any:
    broker = MetadataResponse.MetadataResponseBroker(
        version=version, node_id=2, host="h", port=9093, rack=None
    )
    return MetadataResponse(
        version=version,
        throttle_time_ms=0,
        brokers=[] if error_code else [broker],
        cluster_id="c",
        controller_id=2,
        topics=[],
        error_code=error_code,
    )


def test_top_level_rebootstrap_required_is_read_from_v13() -> None:
    required = MetadataResponse.decode(
        _response(13, ErrorCode.REBOOTSTRAP_REQUIRED).encode(), version=13
    )
    answer = wire.read_metadata(required)
    assert answer.rebootstrap_required and answer.error is not None
    assert answer.error.errno == 129
    assert wire.metadata_requires_rebootstrap(required)
    assert wire.broker_addresses(required) == {}
    ok = wire.read_metadata(_response(13))
    assert ok.error is None and not ok.rebootstrap_required
    # Older answers have no top-level error at all.
    older = NS(topics=[], brokers=[])
    assert wire.read_metadata(older).error is None
    assert not wire.metadata_requires_rebootstrap(older)
    assert wire.broker_addresses(_response(12)) == {2: ("h", 9093)}
