"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml), and a griffe
extension for its API pages.

- The settings reference of configuration.md is generated from ``gateway.Settings`` at
  build time: whatever lies between doctable's two marker comments (the copy GitHub shows,
  kept current by tests/test_settings_docs.py) is replaced by a table read from the
  declarations, which names each setting's environment variable under its keyword.
- A relative link that leaves docs/ (``../plugins/...``, ``../contrib/...``) works on
  GitHub but not on the site: it is pointed at the repository (``repo_url``) or, without
  one, shown as the path it names. A link to a path the repository does not hold is an
  error, so ``mkdocs build --strict`` still catches broken links.
- ``ReSTLiteralMarkers``: a few docstrings end a paragraph with reST's ``::`` before an
  indented block. Rendered as Markdown the block is code already; the marker is shown
  as ``:``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import griffe
from mkdocs.exceptions import PluginError

from gateway.settings import Settings
from gateway.settings.declared import specs_of
from gateway.settings.doctable import BEGIN, END, shown_default

HEADER = "| setting / variable | default | meaning |\n| --- | --- | --- |\n"

#: ``[text](target)`` and ``![alt](target)``, target without spaces or a title
_LINK = re.compile(r"(?P<head>!?\[[^\]]*\]\()(?P<target>[^)\s]+)\)")


def settings_table() -> str:
    """One row per setting of ``Settings``, in declaration order: the keyword above its
    environment variable, the default, the doc line. In a ``div`` that the site's
    stylesheet (stylesheets/extra.css) keeps the names from breaking in."""
    rows = []
    for spec in specs_of(Settings).values():
        meaning = _cell(" ".join(spec.doc.split()))
        name = f"`{spec.name}`<br>`{spec.env}`"
        rows.append(f"| {name} | {shown_default(spec)} | {meaning} |\n")
    return f'<div class="obleth-settings" markdown>\n\n{HEADER}{"".join(rows)}\n</div>\n'


def _cell(markdown: str) -> str:
    """``markdown`` fit for a table cell: a bare ``|`` would end the cell, so it is
    escaped; within a code span Python-Markdown does not split cells, and an escape would
    show, so a ``|`` there is left alone."""
    parts = re.split(r"(`+[^`]*`+)", markdown)
    return "".join(part if i % 2 else part.replace("|", "\\|") for i, part in enumerate(parts))


def with_settings_table(markdown: str) -> str:
    """``markdown`` with the table between the markers replaced by ``settings_table()``."""
    begin = markdown.find(BEGIN)
    end = markdown.find(END, begin)
    if begin < 0 or end < 0:
        raise PluginError(f"configuration.md: the markers {BEGIN!r} and {END!r} are missing")
    return f"{markdown[:begin]}\n{settings_table()}\n{markdown[end + len(END) :]}"


def outside_links(markdown: str, page: Path, docs: Path, repo_url: str | None) -> str:
    """Links of ``page`` (a file under ``docs``) that leave ``docs`` pointed at the
    repository, or written as the path they name."""
    docs = docs.resolve()
    repository = docs.parent  # mkdocs.yml and docs/ are at the repository's root

    def rewrite(match: re.Match[str]) -> str:
        target = match["target"]
        if "://" in target or target.startswith(("#", "/", "mailto:")):
            return match[0]
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve()
        if resolved.is_relative_to(docs):
            return match[0]  # a page of the site: MkDocs checks it
        if not resolved.is_relative_to(repository) or not resolved.exists():
            raise PluginError(f"{page.name}: link to {target!r}, which does not exist")
        relative = resolved.relative_to(repository).as_posix()
        if repo_url is None:
            text = match["head"][match["head"].index("[") + 1 : -2]
            return text if relative in text else f"{text} (`{relative}`)"
        kind = "tree" if resolved.is_dir() else "blob"
        fragment = f"#{anchor}" if anchor else ""
        return f"{match['head']}{repo_url.rstrip('/')}/{kind}/HEAD/{relative}{fragment})"

    return _outside_fences(markdown, lambda text: _LINK.sub(rewrite, text))


def _outside_fences(markdown: str, change: Callable[[str], str]) -> str:
    """``change`` applied to the text of ``markdown`` outside fenced code blocks."""
    parts = re.split(r"(^```.*?^```[ \t]*$)", markdown, flags=re.MULTILINE | re.DOTALL)
    return "".join(part if index % 2 else change(part) for index, part in enumerate(parts))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri == "configuration.md":
        markdown = with_settings_table(markdown)
    docs = Path(config["docs_dir"])
    return outside_links(markdown, Path(page.file.abs_src_path), docs, config.get("repo_url"))


class ReSTLiteralMarkers(griffe.Extension):
    """``text::`` at the end of a line becomes ``text:``; a line holding only ``::`` goes."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            value = re.sub(r"^[ \t]*::[ \t]*\n", "", obj.docstring.value, flags=re.MULTILINE)
            obj.docstring.value = re.sub(r"(\S)::[ \t]*$", r"\1:", value, flags=re.MULTILINE)
