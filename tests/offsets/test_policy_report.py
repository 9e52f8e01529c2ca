from __future__ import annotations

import json

import pytest

from epochguard.offsets import (
    DetectedBy,
    EpochOffset,
    InvalidPolicyError,
    LogTruncationError,
    OffsetOutOfRangeError,
    OffsetPolicy,
    PositionSource,
    ResetStrategy,
    RetryBackoff,
    TopicPartition,
    TruncationDecision,
    TruncationReport,
)

TP = TopicPartition("orders", 3)
AT_7 = EpochOffset(7, 1)


def report(divergence: EpochOffset | None = AT_7) -> TruncationReport:
    return TruncationReport(TP, EpochOffset(10, 1), divergence, DetectedBy.METADATA, 2)


def test_report_lost_range() -> None:
    r = report()
    assert (r.lost_from, r.lost_to, r.lost_count) == (7, 10, 3)
    assert r.topic == "orders" and r.partition == 3


def test_report_unknown_divergence_is_none_safe() -> None:
    r = report(None)
    assert (r.lost_from, r.lost_to, r.lost_count) == (None, 10, None)
    assert "unknown" in r.describe()


def test_report_says_record_or_records() -> None:
    one = TruncationReport(TP, EpochOffset(8, 1), AT_7, DetectedBy.METADATA, 2)
    assert "[7, 8) (1 record) consumed" in one.describe()
    assert "[7, 10) (3 records) consumed" in report().describe()
    assert "(0 records)" in report(EpochOffset(12, 1)).describe()


def test_report_divergence_above_position_counts_zero() -> None:
    assert report(EpochOffset(12, 1)).lost_count == 0


def test_report_to_dict_is_json() -> None:
    d = json.loads(json.dumps(report().to_dict()))
    assert d == {
        "topic": "orders",
        "partition": 3,
        "consumed_to": {"offset": 10, "leader_epoch": 1},
        "divergence": {"offset": 7, "leader_epoch": 1},
        "lost_from": 7,
        "lost_to": 10,
        "lost_count": 3,
        "new_leader_epoch": 2,
        "detected_by": "metadata",
        "position_source": None,
    }


def test_report_to_dict_has_plain_values() -> None:
    r = TruncationReport(
        TP, EpochOffset(10, 1), AT_7, DetectedBy.METADATA, 2, position_source=PositionSource.SEEK
    )
    d = r.to_dict()
    assert type(d["position_source"]) is str and d["position_source"] == "seek"
    assert type(d["detected_by"]) is str


def test_detected_by_accepts_strings() -> None:
    r = TruncationReport(TP, EpochOffset(1), None, "topic_recreated")  # type: ignore[arg-type]
    assert r.detected_by is DetectedBy.TOPIC_RECREATED
    with pytest.raises(ValueError):
        TruncationReport(TP, EpochOffset(1), None, "gut_feeling")  # type: ignore[arg-type]


def test_log_truncation_error_is_out_of_range_and_carries_report() -> None:
    err = LogTruncationError(report())
    assert isinstance(err, OffsetOutOfRangeError)
    assert err.report.lost_count == 3
    assert "orders-3" in str(err) and "[7, 10)" in str(err)


@pytest.mark.parametrize(
    ("reset", "expected"),
    [
        ("earliest", TruncationDecision.REWIND),
        ("latest", TruncationDecision.REWIND),
        ("none", TruncationDecision.RAISE),
    ],
)
def test_auto_is_kip320(reset: str, expected: TruncationDecision) -> None:
    assert OffsetPolicy(auto_offset_reset=reset).decide(report()) is expected


def test_named_policies() -> None:
    assert OffsetPolicy(on_truncation="raise").decide(report()) is TruncationDecision.RAISE
    assert OffsetPolicy("none", "rewind").decide(report()) is TruncationDecision.REWIND
    assert OffsetPolicy(on_truncation="RAISE").on_truncation == "raise"
    assert OffsetPolicy(auto_offset_reset="Earliest").auto_offset_reset is ResetStrategy.EARLIEST


def test_callable_policy_sees_the_report() -> None:
    seen: list[TruncationReport] = []

    def handler(r: TruncationReport) -> EpochOffset:
        seen.append(r)
        return EpochOffset(0)

    assert OffsetPolicy(on_truncation=handler).decide(report()) == EpochOffset(0)
    assert seen == [report()]


def test_callable_may_answer_with_strings() -> None:
    assert OffsetPolicy(on_truncation=lambda r: "raise").decide(report()) is (
        TruncationDecision.RAISE
    )


def test_callable_bad_answer_is_a_policy_error() -> None:
    with pytest.raises(InvalidPolicyError, match="returned 42"):
        OffsetPolicy(on_truncation=lambda r: 42).decide(report())  # type: ignore[arg-type,return-value]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"auto_offset_reset": "smallest"},
        {"auto_offset_reset": None},
        {"on_truncation": "ignore"},
        {"on_truncation": 3},
        {"on_truncation": str},
        {"retry_backoff": 1.0},
    ],
)
def test_invalid_policies_fail_at_construction(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidPolicyError) as info:
        OffsetPolicy(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)


def test_backoff_is_exponential_and_capped() -> None:
    b = RetryBackoff(initial=0.1, maximum=1.0, multiplier=2.0)
    assert [b.delay(i) for i in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert b.delay(10_000) == 1.0
    with pytest.raises(InvalidPolicyError):
        RetryBackoff(initial=0)
    with pytest.raises(InvalidPolicyError):
        RetryBackoff(initial=2, maximum=1)
