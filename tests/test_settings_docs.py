"""The settings table of docs/configuration.md is the one generated from the declarations."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.settings import setting_names
from gateway.settings.declared import specs_of
from gateway.settings.doctable import BEGIN, DOC, END, main, table, with_table
from gateway.settings.fields import Settings


def test_the_docs_table_is_the_generated_one() -> None:
    """A setting added or its doc line changed without regenerating the table fails here:
    run ``python -m gateway.settings.doctable``."""
    text = DOC.read_text(encoding="utf-8")
    assert with_table(text) == text, "stale table: run python -m gateway.settings.doctable"


def test_the_table_has_one_row_per_setting_in_declaration_order() -> None:
    """Every setting a user may write is documented, once, where the reader expects it."""
    rows = table().splitlines()[2:]
    assert [row.split("`")[1] for row in rows] == list(setting_names())


@pytest.mark.parametrize("name", setting_names())
def test_every_doc_line_is_one_line_ending_a_sentence(name: str) -> None:
    """A doc line is one Markdown line ending a sentence: it becomes one table row."""
    doc = specs_of(Settings)[name].doc
    assert doc.strip() == doc and "\n" not in doc and doc.endswith(".")


def test_regenerating_rewrites_only_between_the_markers(tmp_path: Path) -> None:
    """Whatever surrounds the table (sections others edit) is kept byte for byte."""
    before, after = "# Title\n\nintro\n\n", "\n\n## Overflow policies\n\nhand-written\n"
    doc = tmp_path / "configuration.md"
    doc.write_text(f"{before}{BEGIN}\n| stale | table |\n{END}{after}", encoding="utf-8")
    assert main(["--check", "--path", str(doc)]) == 1
    assert main(["--path", str(doc)]) == 0
    text = doc.read_text(encoding="utf-8")
    assert text == f"{before}{BEGIN}\n\n{table()}\n{END}{after}"
    assert main(["--check", "--path", str(doc)]) == 0


def test_a_file_without_markers_is_refused_not_rewritten(tmp_path: Path) -> None:
    """Without the markers the tool cannot know where the table ends: it changes nothing."""
    doc = tmp_path / "configuration.md"
    doc.write_text("## Settings\n\n| a | table |\n", encoding="utf-8")
    assert main(["--path", str(doc)]) == 2
    assert doc.read_text(encoding="utf-8") == "## Settings\n\n| a | table |\n"
