"""The summary table is derived from recorded events, never written by hand."""

from __future__ import annotations

import json
from pathlib import Path

from .summary import describe_epochguard, describe_reference, summarize


def test_reference_cells_come_from_the_events() -> None:
    phases = {
        "before": [{"event": "record", "offset": 0, "value": "a0"}],
        "after": [
            {
                "event": "exception",
                "type": "LogTruncationError",
                "text": "Detected truncated partitions: {tp: OffsetAndMetadata(offset=5, "
                "metadata='', leader_epoch=0)}",
            },
            {"event": "record", "offset": 5, "value": "b0"},
            {"event": "record", "offset": 6, "value": "b1"},
        ],
    }
    assert describe_reference("kafka-python", phases) == (
        "LogTruncationError (divergence 5); read 5..6 (b0, b1)"
    )
    java = {
        "after_restart": [
            {"event": "truncation", "divergent_offsets": {"t-0": {"offset": 5, "leader_epoch": 0}}}
        ]
    }
    assert describe_reference("java", java) == ("LogTruncationException (divergence 5); no records")
    silent = {"after": [{"event": "record", "offset": 8, "value": "b3"}]}
    assert describe_reference("confluent-kafka", silent) == "no error; read 8 (b3)"
    franzgo = {
        "after": [
            {"event": "data_loss", "consumed_to": 8, "reset_to": 5},
            {"event": "record", "offset": 5, "value": "b0"},
            {"event": "fetch_error", "code": "OFFSET_OUT_OF_RANGE"},
            {"event": "polled", "count": 1},
        ]
    }
    assert describe_reference("franz-go", franzgo) == (
        "ErrDataLoss (consumed to 8, reset to 5); OFFSET_OUT_OF_RANGE; read 5 (b0)"
    )


def test_epochguard_cells_and_the_table(tmp_path: Path) -> None:
    subject = {
        "after": [
            {
                "event": "truncation_report",
                "divergence": {"offset": 5, "leader_epoch": 0},
                "lost_count": 3,
                "detected_by": "metadata",
            },
            {"event": "exception", "type": "LogTruncationError"},
            {"event": "seek", "offset": 5, "leader_epoch": 0},
            {"event": "record", "offset": 5, "value": "b0"},
        ],
        "outcome": {"policy": "raise", "errors": ["LogTruncationError"]},
    }
    assert describe_epochguard(subject) == (
        "report: divergence 5@e0, 3 lost (metadata); raised LogTruncationError; "
        "app seeks to 5; read 5 (b0)"
    )
    (tmp_path / "epochguard").mkdir()
    (tmp_path / "epochguard" / "s-apache.json").write_text(
        json.dumps({"scenario": "s", "cluster": "apache", "clients": {"x/raise": subject}})
    )
    (tmp_path / "s-embedded.json").write_text(
        json.dumps({"answers": {}, "clients": {"kafka-python": {"after": []}}})
    )
    table = summarize(tmp_path)
    assert "## s" in table
    assert "| kafka-python | not run | no error; no records |" in table
    assert (
        "| EpochConsumer raise | report: divergence 5@e0, 3 lost (metadata); raised "
        "LogTruncationError; app seeks to 5; read 5 (b0) | not run |"
    ) in table
