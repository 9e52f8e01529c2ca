"""The documentation site (mkdocs.yml, built by ``make docs``): every page in docs/ is in the
nav and every nav entry is a page, so a new page cannot be left out of the site; every public
name of the package has an entry in the API reference; and the two pieces of site tooling in
tools/docs (the hook for links that leave docs/, the griffe extension for Sphinx roles) do
what the build relies on, tested on both sides."""

from __future__ import annotations

import importlib
import importlib.util
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API = DOCS / "reference" / "api"

#: The packages whose ``__all__`` is the public API the reference must cover.
PUBLIC_MODULES = (
    "epochguard",
    "epochguard.consumer",
    "epochguard.spark_connector",
    "epochguard.testing",
)


class _ConfigLoader(yaml.SafeLoader):
    """Reads mkdocs.yml; its ``!!python/...`` tags (the slug function) become None."""


_ConfigLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_args: None)


def mkdocs_config() -> dict[str, Any]:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_ConfigLoader)
    assert isinstance(config, dict)
    return config


def nav_pages(nav: Any) -> Iterator[str]:
    """Every page path in a MkDocs nav (entries are paths, {title: path} or {title: [...]})."""
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from nav_pages(value)


def test_nav_pages_walks_every_form() -> None:
    nav = ["index.md", {"A": "a.md"}, {"B": ["b/index.md", {"C": "b/c.md"}]}]
    assert list(nav_pages(nav)) == ["index.md", "a.md", "b/index.md", "b/c.md"]


def test_every_page_in_docs_is_in_the_nav() -> None:
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    missing = sorted(pages - set(nav_pages(mkdocs_config()["nav"])))
    assert not missing, f"pages not in the nav of mkdocs.yml: {missing}"


def test_the_nav_names_no_missing_file_and_no_page_twice() -> None:
    listed = list(nav_pages(mkdocs_config()["nav"]))
    assert "index.md" in listed and "reference/api/index.md" in listed
    absent = sorted(p for p in listed if not (DOCS / p).is_file())
    assert not absent, f"nav entries without a file in docs/: {absent}"
    twice = sorted({p for p in listed if listed.count(p) > 1})
    assert not twice, f"pages in the nav more than once: {twice}"


def test_the_site_builds_strict_into_build_site_in_ci() -> None:
    config = mkdocs_config()
    assert config["strict"] is True
    assert config["site_dir"] == "build/site"
    assert "build/" in (ROOT / ".gitignore").read_text().split()
    recipe = re.search(r"^docs:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe and "mkdocs build --strict" in recipe.group(1)
    assert re.search(r"^make docs$", (ROOT / ".ci" / "run").read_text(), re.M)


def test_the_doc_tooling_is_in_the_docs_extra_and_in_dev() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = {re.split(r"[<>=!~;\[]", d, maxsplit=1)[0] for d in extras["docs"]}
    assert {"mkdocs", "mkdocs-material", "mkdocstrings-python"} <= names
    assert all(re.search(r">=\d", d) for d in extras["docs"]), "pin a lower bound"
    missing = sorted(set(extras["docs"]) - set(extras["dev"]))
    assert not missing, f"in the docs extra but not in dev (CI installs dev): {missing}"


# -- the API reference -----------------------------------------------------------------------

DIRECTIVE = re.compile(r"^::: ([\w.]+)$", re.M)


def _resolve(path: str) -> object:
    """The object a ``::: path`` directive names (the longest importable module prefix, then
    attributes)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise LookupError(path)


def api_directives() -> dict[str, object]:
    return {
        path: _resolve(path)
        for page in sorted(API.glob("*.md"))
        for path in DIRECTIVE.findall(page.read_text())
    }


def test_every_public_name_has_an_entry_in_the_api_reference() -> None:
    documented = [id(obj) for obj in api_directives().values()]
    missing = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            owner = getattr(obj, "__module__", module_name) or module_name
            if name == "__version__" or not owner.startswith("epochguard"):
                continue  # kafka's TopicPartition is re-exported, not documented here
            if id(obj) not in documented:
                missing.append(f"{module_name}.{name}")
    assert not missing, f"public names with no ::: entry under docs/reference/api: {missing}"


def test_the_api_reference_lists_the_main_entry_points() -> None:
    paths = set(api_directives())
    assert {
        "epochguard.EpochConsumer",
        "epochguard.AIOEpochConsumer",
        "epochguard.EpochOffset",
        "epochguard.TruncationReport",
        "epochguard.OffsetPolicy",
        "epochguard.SqliteOffsetStore",
        "epochguard.JsonFileOffsetStore",
        "epochguard.consumer.LogTruncationError",
        "epochguard.spark_connector.register",
        "epochguard.spark_connector.datasource.EpochGuardDataSource",
        "epochguard.testing.EmbeddedCluster",
    } <= paths


def test_every_error_class_has_an_api_entry() -> None:
    import epochguard.consumer.errors as consumer_errors
    import epochguard.offsets.errors as core_errors
    import epochguard.spark_connector.errors as spark_errors

    documented = {id(obj) for obj in api_directives().values()}
    missing = [
        f"{module.__name__}.{name}"
        for module in (consumer_errors, core_errors, spark_errors)
        for name, obj in vars(module).items()
        if isinstance(obj, type)
        and issubclass(obj, Exception)
        and obj.__module__ == module.__name__
        and id(obj) not in documented
    ]
    assert not missing, missing


# -- tools/docs ------------------------------------------------------------------------------


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "docs" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    return _load("mkdocs_hooks")


def _rewrite(hooks: ModuleType, markdown: str, repo_url: str | None = None) -> str:
    result = hooks.repository_links(
        markdown,
        page_dir=DOCS / "guides",
        docs_dir=DOCS,
        repo_root=ROOT,
        repo_url=repo_url,
    )
    assert isinstance(result, str)
    return result


def test_a_link_out_of_docs_becomes_the_repository_path(hooks: ModuleType) -> None:
    text = (
        "see [benchmarks/README.md](../../benchmarks/README.md) and [the\nbench](../../benchmarks)"
    )
    assert _rewrite(hooks, text) == ("see `benchmarks/README.md` and the\nbench (`benchmarks`)")


def test_a_link_out_of_docs_goes_to_the_repository_when_mkdocs_names_one(
    hooks: ModuleType,
) -> None:
    text = "[how](../../benchmarks/README.md#method)"
    assert _rewrite(hooks, text, "https://example.org/o/epochguard/") == (
        "[how](https://example.org/o/epochguard/blob/HEAD/benchmarks/README.md#method)"
    )


def test_links_within_docs_and_in_code_stay(hooks: ModuleType) -> None:
    kept = [
        "[consumer](consumer.md#fetch-sessions-kip-227)",
        "[concepts](../concepts.md)",
        "[a section](#metrics)",
        "[site](https://example.org/x.md)",
        "[missing](../../benchmarks/NO_SUCH_FILE.md)",  # left for the strict build to report
        "[outside the repository](../../../elsewhere.md)",
        "```text\n[readme](../../benchmarks/README.md)\n```",
        "- item:\n\n  ```text\n  [readme](../../benchmarks/README.md)\n  ```",
    ]
    for text in kept:
        assert _rewrite(hooks, text) == text


@pytest.fixture(scope="module")
def roles() -> ModuleType:
    return _load("griffe_sphinx_roles")


def test_sphinx_roles_become_references_that_resolve_or_fail(
    roles: ModuleType, tmp_path: Path
) -> None:
    import griffe

    package = tmp_path / "rolepkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import logging\n"
        "from collections import OrderedDict\n\n"
        "from rolepkg.inner import Thing\n\n\n"
        "class Widget:\n"
        '    """Made from :class:`Thing`, see :meth:`spin` and :func:`~rolepkg.inner.helper`,\n'
        "    kept in :class:`OrderedDict` (:class:`logging.Logger` logs), not :class:`Gone`,\n"
        '    :meth:`Thing.vanished` or :class:`rolepkg.inner.Gone`."""\n\n'
        "    def spin(self) -> None:\n"
        '        """Spins; :meth:`~Thing.turn` turns."""\n\n\n'
        "def handler() -> None:\n"
        '    """A :class:`logging.Handler` (imported here), not :class:`logging.Nope`."""\n'
    )
    (package / "inner.py").write_text(
        "class Thing:\n    def turn(self) -> None: ...\n\n\ndef helper() -> None: ...\n"
    )
    pkg = griffe.load(
        "rolepkg",
        search_paths=[str(tmp_path)],
        extensions=griffe.load_extensions(roles.SphinxRoles),
    )
    widget = pkg["Widget"].docstring.value
    optional = '<autoref identifier="{}" optional><code>{}</code></autoref>'
    assert optional.format("rolepkg.inner.Thing", "Thing") in widget
    assert optional.format("rolepkg.Widget.spin", "spin()") in widget
    assert optional.format("rolepkg.inner.helper", "helper()") in widget
    # Outside the package: resolved through the import, rendered as code.
    assert optional.format("collections.OrderedDict", "OrderedDict") in widget
    assert optional.format("logging.Logger", "logging.Logger") in widget
    # Names that are nowhere: required references, which fail mkdocs build --strict.
    assert "[<code>Gone</code>][Gone]" in widget
    assert "[<code>Thing.vanished()</code>][Thing.vanished]" in widget
    assert "[<code>rolepkg.inner.Gone</code>][rolepkg.inner.Gone]" in widget
    assert ":class:" not in widget and ":meth:" not in widget
    handler = pkg["handler"].docstring.value
    assert optional.format("logging.Handler", "logging.Handler") in handler
    assert optional.format("logging.Nope", "logging.Nope") in handler  # not checked: not loaded
    spin = pkg["Widget.spin"].docstring.value
    assert optional.format("rolepkg.inner.Thing.turn", "turn()") in spin


def test_attrs_classes_get_the_init_attrs_generates(tmp_path: Path) -> None:
    import griffe

    attrs_init = _load("griffe_attrs_init")
    package = tmp_path / "attrspkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from typing import ClassVar\n\n"
        "import attrs\n\n\n"
        "@attrs.frozen\n"
        "class Base:\n"
        "    offset: int\n"
        "    KIND: ClassVar[str] = 'base'\n"
        "    epoch: int | None = None\n\n\n"
        "@attrs.frozen(order=False)\n"
        "class Child(Base):\n"
        "    _secret: str = attrs.field(default='s', kw_only=True)\n"
        "    items: list[int] = attrs.field(factory=list)\n"
        "    cache: dict[str, int] = attrs.field(init=False)\n\n"
        "    @property\n"
        "    def doubled(self) -> int:\n"
        "        return self.offset * 2\n\n\n"
        "@attrs.define(kw_only=True)\n"
        "class Options:\n"
        "    name: str\n\n\n"
        "@attrs.frozen\n"
        "class Custom:\n"
        "    value: int\n\n"
        "    def __init__(self, text: str) -> None: ...\n\n\n"
        "class Plain:\n"
        "    value: int = 0\n"
    )
    extensions = griffe.load_extensions(attrs_init.AttrsInit)
    pkg = griffe.load("attrspkg", search_paths=[str(tmp_path)], extensions=extensions)

    def signature(name: str) -> list[tuple[str, str, str | None]]:
        init = pkg[name].members["__init__"]
        return [(p.name, p.kind.value, p.default and str(p.default)) for p in init.parameters][1:]

    assert signature("Base") == [
        ("offset", "positional or keyword", None),
        ("epoch", "positional or keyword", "None"),
    ]
    assert signature("Child") == [
        ("offset", "positional or keyword", None),
        ("epoch", "positional or keyword", "None"),
        ("items", "positional or keyword", "list()"),
        ("secret", "keyword-only", "'s'"),
    ]
    assert signature("Options") == [("name", "keyword-only", None)]
    assert signature("Custom") == [("text", "positional or keyword", None)]  # its own
    assert "__init__" not in pkg["Plain"].members
