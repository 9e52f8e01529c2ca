"""The install check, the getting-started pages, the offset-store recipe and the complete
programs of other guides run as written, and import nothing that installing epochguard does
not install (the standard library, epochguard and its runtime dependencies): a recipe that
needs a development dependency fails here. Every Python block of the user pages parses."""

from __future__ import annotations

import ast
import re
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: Import names of the runtime dependencies' distributions.
_IMPORT_NAMES = {"kafka-python": "kafka", "attrs": "attr"}


def runtime_modules() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[\s<>=!~;\[]", d, maxsplit=1)[0] for d in project["dependencies"]}
    return {"epochguard", "attrs", *(_IMPORT_NAMES.get(n, n).replace("-", "_") for n in names)}


def python_blocks(path: Path) -> list[str]:
    """The page's Python code blocks, those inside list items dedented."""
    found = re.findall(r"^( *)```python\n(.*?)^\1```", path.read_text(), flags=re.S | re.M)
    return [textwrap.dedent(code) for _indent, code in found]


def imported_modules(code: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


RECIPES = [
    DOCS / "install.md",
    DOCS / "getting-started" / "first-consumer.md",
    DOCS / "getting-started" / "first-truncation.md",
    DOCS / "guides" / "offset-stores.md",
]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_imports_only_what_the_package_installs(path: Path) -> None:
    allowed = runtime_modules() | set(sys.stdlib_module_names)
    for block in python_blocks(path):
        assert imported_modules(block) <= allowed, imported_modules(block) - allowed


def test_the_import_check_catches_a_development_dependency() -> None:
    allowed = runtime_modules() | set(sys.stdlib_module_names)
    assert "confluent_kafka" in imported_modules("from confluent_kafka import Consumer\n")
    assert "confluent_kafka" not in allowed and "kafka" in allowed and "structlog" in allowed


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_runs(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (block, *_) = python_blocks(path)  # the page's complete program comes first
    exec(compile(block, str(path.relative_to(ROOT)), "exec"), {"__name__": "recipe"})
    out = capsys.readouterr().out
    if path.name == "install.md":
        # The check program's output as the page shows it.
        caught = re.findall(r"^caught: .*$", path.read_text(), flags=re.M)
        assert out.splitlines() == ["read: " + ", ".join(f"order-{i}" for i in range(7)), *caught]
    if path.name == "first-truncation.md":
        # The page's sample output, line for line where it cannot vary.
        sample = re.findall(r"```\n(read .*?)```", path.read_text(), flags=re.S)[0]
        for expected in sample.splitlines():
            if expected.startswith(("read ", "lost offsets")):
                assert expected in out.splitlines(), (expected, out)


#: Complete programs that are not a page's first block: (page, what the block contains).
PROGRAMS = [
    (DOCS / "guides" / "transactions.md", "cluster.pause_replication(follower)"),
    (DOCS / "guides" / "testing.md", 'epochs="raft"'),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("path", "marker"), PROGRAMS, ids=[f"{p.name}:{m}" for p, m in PROGRAMS])
def test_program_runs(path: Path, marker: str) -> None:
    (block,) = [b for b in python_blocks(path) if marker in b and "EmbeddedCluster(" in b]
    allowed = runtime_modules() | set(sys.stdlib_module_names)
    assert imported_modules(block) <= allowed, imported_modules(block) - allowed
    exec(compile(block, str(path.relative_to(ROOT)), "exec"), {"__name__": "recipe"})


#: The pages a user reads: all but design.md (for contributors), which has pseudocode in
#: Python fences.
USER_PAGES = [
    ROOT / "README.md",
    *sorted(p for p in DOCS.rglob("*.md") if p.name != "design.md"),
]


@pytest.mark.parametrize("path", USER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_parse(path: Path) -> None:
    # Fragments too (they use names defined elsewhere): a reader pastes them.
    for block in python_blocks(path):
        ast.parse(block, str(path.relative_to(ROOT)))
