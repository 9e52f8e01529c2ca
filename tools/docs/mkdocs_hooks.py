"""MkDocs hooks for the documentation site (mkdocs.yml, ``hooks:``).

The pages in docs/ are read on GitHub too, where a relative link to a file elsewhere in the
repository (``../benchmarks/README.md``) works. The site holds only docs/, so before a page
is rendered such a link becomes a link into the source repository when mkdocs.yml names one
(``repo_url``), or else the file's path in the repository, as code. A link that leaves docs/ for a
file that does not exist stays as it is, and the strict build fails on it.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

# [text](target) outside code; the text may span lines, the target has no spaces.
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)\)")
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```|~~~).*?^(?P=indent)(?P=fence)", re.S | re.M)


def on_page_markdown(
    markdown: str, *, page: Page, config: MkDocsConfig, files: Files, **kwargs: Any
) -> str:
    docs_dir = Path(config.docs_dir).resolve()
    return repository_links(
        markdown,
        page_dir=(docs_dir / page.file.src_path).parent,
        docs_dir=docs_dir,
        repo_root=Path(config.config_file_path).resolve().parent,
        repo_url=config.repo_url,
    )


def repository_links(
    markdown: str, *, page_dir: Path, docs_dir: Path, repo_root: Path, repo_url: str | None
) -> str:
    """``markdown`` with its links to repository files outside ``docs_dir`` rewritten."""

    def rewrite(match: re.Match[str]) -> str:
        target = match.group("target")
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return match.group(0)
        file_part, _, fragment = target.partition("#")
        dest = (page_dir / file_part).resolve()
        if dest.is_relative_to(docs_dir) or not dest.is_relative_to(repo_root):
            return match.group(0)
        if not dest.exists():
            return match.group(0)  # the strict build reports it
        path = PurePosixPath(dest.relative_to(repo_root)).as_posix()
        text = match.group("text")
        if repo_url:
            kind = "tree" if dest.is_dir() else "blob"
            url = f"{repo_url.rstrip('/')}/{kind}/HEAD/{path}"
            return f"[{text}]({url}{'#' + fragment if fragment else ''})"
        if text.strip("`") == path:
            return f"`{path}`"
        return f"{text} (`{path}`)"

    # Links inside fenced code are code, not links.
    pieces, last = [], 0
    for fence in FENCE.finditer(markdown):
        pieces.append(LINK.sub(rewrite, markdown[last : fence.start()]))
        pieces.append(fence.group(0))
        last = fence.end()
    pieces.append(LINK.sub(rewrite, markdown[last:]))
    return "".join(pieces)
