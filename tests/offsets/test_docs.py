"""The design document lists the whole state machine; keep it in sync with the code."""

from __future__ import annotations

from pathlib import Path

from epochguard.offsets import TRANSITIONS, PartitionState, Trigger

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_design_doc_names_every_state_and_trigger() -> None:
    text = (DOCS / "design.md").read_text()
    for state in PartitionState:
        assert f"`{state.name}`" in text, state
    for trigger in Trigger:
        assert f"`{trigger.name}`" in text, trigger
    for state, row in TRANSITIONS.items():
        for trigger, target in row.items():
            if trigger.name.startswith(("SEEK_", "RESET_REQUESTED", "STOP_NO_OFFSET")):
                continue  # the "any" rows
            line = f"| `{state.name}` | `{trigger.name}` | `{target.name}` |"
            assert line in text, line


def test_concepts_doc_has_the_mermaid_diagrams() -> None:
    text = (DOCS / "concepts.md").read_text()
    assert text.count("```mermaid") >= 2
    assert "epoch cache" in text


def test_design_doc_lists_every_sub_state() -> None:
    from epochguard.offsets import SUB_STATES

    text = (DOCS / "design.md").read_text()
    for field, sub in SUB_STATES.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{field}` |")), None)
        assert row is not None, field
        for state in sub.states:
            assert f"`{state.name}`" in row, (field, state)
        for method in sub.written_by + sub.read_by:
            assert f"`{method}`" in row, (field, method)
