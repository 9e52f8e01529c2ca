"""Griffe extension for the documentation site: Sphinx roles in docstrings become links.

epochguard's docstrings name other objects the Sphinx way (``:class:`EpochOffset```,
``:meth:`~Fetcher.pump_until```); mkdocstrings renders docstrings as Markdown, where a role
would show as literal text. Each role becomes a cross-reference that mkdocs-autorefs turns
into a link when the object is on a page of the site:

- a name that resolves to an object in the loaded packages (by Python's scoping from the
  docstring's object outwards, or as a full dotted path) becomes an *optional* reference:
  a link where the API reference documents that object, inline code where it does not
  (most internals are not on the site, and naming them is not an error);
- a name that resolves to nothing becomes a *required* reference, so ``mkdocs build
  --strict`` fails on it: a role naming a renamed or removed object is a broken link.

Names outside epochguard (``kafka.structs.TopicPartition``, the standard library) resolve to
their import path and render as code: the site links to no other site's inventory.
"""

from __future__ import annotations

import functools
import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(class|meth|func|data|attr|exc|mod|obj|const):`(?P<target>[^`]+)`")

logger = griffe.get_logger("griffe_sphinx_roles")


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring of a package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for obj in _walk(pkg):
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = ROLE.sub(
                    functools.partial(_reference, obj=obj, loader=loader), obj.docstring.value
                )


def _walk(obj: griffe.Object) -> list[griffe.Object]:
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            found.extend(_walk(member))  # type: ignore[arg-type]
    return found


def _reference(match: re.Match[str], obj: griffe.Object, loader: griffe.GriffeLoader) -> str:
    target = match.group("target").strip()
    short = target.startswith("~")
    name = target.lstrip("~.").removesuffix("()")
    title = name.rsplit(".", 1)[-1] if short else name
    if match.group(1) in {"meth", "func"}:
        title += "()"
    path = _resolve(name, obj, loader)
    code = f"<code>{html.escape(title)}</code>"
    if path is None:
        # Not an object anywhere: a required reference, which fails the strict build.
        return f"[{code}][{name}]"
    return f'<autoref identifier="{html.escape(path)}" optional>{code}</autoref>'


def _resolve(name: str, obj: griffe.Object, loader: griffe.GriffeLoader) -> str | None:
    """The full path of ``name`` as seen from ``obj``'s docstring, or None."""
    collection = loader.modules_collection
    head, _, rest = name.partition(".")
    if rest and head in collection.members:
        # A full path into a loaded package (epochguard.offsets.EpochOffset).
        return name if _exists(name, collection) else None
    head_found = False
    scope: griffe.Object | None = obj
    while scope is not None:
        if head in scope.members:
            member = scope.members[head]
            # An imported name is an alias: its target is where it lives.
            base = member.target_path if isinstance(member, griffe.Alias) else member.path
        else:
            try:
                base = scope.resolve(head)
            except griffe.NameResolutionError:
                scope = scope.parent
                continue
        head_found = True
        full = f"{base}.{rest}" if rest else base
        # In a loaded package the object must exist; another package's names are taken
        # as they are imported.
        if full.split(".", 1)[0] not in collection.members or _exists(full, collection):
            return full
        scope = scope.parent
    if rest and not head_found:
        return name  # another package's full path (logging.Logger), not imported here
    return None


def _exists(path: str, collection: griffe.ModulesCollection) -> bool:
    try:
        collection[path]
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False
    return True
