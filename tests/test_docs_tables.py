"""The benchmark tables in docs/ are what ``python -m benchmarks._tables`` makes of the
current result files: a table cannot disagree with its data, and every benchmark with a
table is shown somewhere."""

from __future__ import annotations

import importlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tables() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT))
        yield importlib.import_module("benchmarks._tables")


def test_the_tables_in_the_docs_match_the_results(tables: ModuleType) -> None:
    files = tables.marked_files()
    assert ROOT / "docs" / "performance.md" in files
    stale = {str(p.relative_to(ROOT)): tables.stale_sections(p) for p in files}
    assert not any(stale.values()), f"regenerate with python -m benchmarks._tables: {stale}"


def test_every_table_is_in_the_docs(tables: ModuleType) -> None:
    pages = tables.marked_files()
    shown = {m.group("name") for p in pages for m in tables.SECTION.finditer(p.read_text())}
    assert shown == set(tables.TABLES)


def test_a_changed_result_makes_its_table_stale(tables: ModuleType, tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(tables.RESULTS, results)
    page = ROOT / "docs" / "performance.md"
    assert tables.stale_sections(page, results) == []
    record = json.loads((results / "latency.json").read_text())
    record["result"]["rows"][0]["p99_ms"] = 999.5
    (results / "latency.json").write_text(json.dumps(record))
    assert tables.stale_sections(page, results) == ["latency"]
    assert "999.5 ms" in tables.render(page.read_text(), results)


def test_unknown_tables_and_missing_results_are_named(tables: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(tables.TableError, match="no table named 'nope'"):
        tables.render("<!-- table: nope -->\n<!-- /table: nope -->\n")
    with pytest.raises(tables.TableError, match="no result file"):
        tables.render("<!-- table: latency -->\n<!-- /table: latency -->\n", tmp_path)
