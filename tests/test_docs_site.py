"""The documentation site: ``mkdocs build --strict`` passes, and what a reader relies on is
in the built pages (every setting, every hook, every page of the nav), generated from the
code rather than copied. Also: the snippets of the plugin guide are the shipped example
plugin's code and run, and the tutorial names only real settings."""

from __future__ import annotations

import ast
import html
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from mkdocs.exceptions import PluginError as MkDocsPluginError

import gateway
from gateway import hookspecs
from gateway.settings import Settings
from gateway.settings.declared import specs_of
from gateway.settings.doctable import shown_default

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
EXAMPLE_PLUGIN = REPO / "plugins" / "obleth-example-capacity"
#: a proxy nothing listens on: a build that tried to download anything would fail
NOWHERE = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built with ``--strict`` from outside the repository and offline."""
    out = tmp_path_factory.mktemp("site")
    env = {key: value for key, value in os.environ.items() if not key.startswith("OBLETH_")}
    env.update(
        NO_MKDOCS_2_WARNING="1",
        HTTP_PROXY=NOWHERE,
        HTTPS_PROXY=NOWHERE,
        ALL_PROXY=NOWHERE,
        http_proxy=NOWHERE,
        https_proxy=NOWHERE,
        NO_PROXY="",
        no_proxy="",
    )
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    command += ["--config-file", str(REPO / "mkdocs.yml")]
    result = subprocess.run(
        command, cwd=out, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}"
    return out


def _nav_pages(nav: object) -> Iterator[str]:
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for entry in nav:
            yield from _nav_pages(entry)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _nav_pages(value)


def _built(site: Path, page: str) -> Path:
    """Where MkDocs writes ``page`` (``use_directory_urls``)."""
    stem = page.removesuffix(".md")
    return site / "index.html" if stem == "index" else site / stem / "index.html"


class _Text(HTMLParser):
    """The text of a page's ``<article>``, and its tables as rows of cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.text: list[str] = []
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "article":
            self.depth += 1
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "br" and self._cell is not None:
            self._cell.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "article":
            self.depth -= 1
        elif tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def _read(page: Path) -> _Text:
    parser = _Text()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


def _words(text: str) -> str:
    return " ".join(text.split())


def _plain(markdown: str) -> str:
    """What Markdown (a doc line, a docstring) reads as once rendered: code marks and
    emphasis gone, links reduced to their text, no list bullets, whitespace collapsed."""
    parts = re.split(r"(`+[^`]*`+)", markdown.replace("\\|", "|"))
    for index, part in enumerate(parts):
        if index % 2:
            parts[index] = part.strip("`")
        else:
            part = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", part)
            part = re.sub(r"\*([^*\s][^*]*)\*", r"\1", part)
            parts[index] = re.sub(r"^\s*- ", "", part, flags=re.MULTILINE)
    return _words("".join(parts))


def _fenced(markdown: str, section: str, language: str = "python") -> list[str]:
    """The ``language`` code blocks of the ``## section`` of ``markdown``, in order."""
    start = markdown.index(f"\n## {section}\n")
    end = markdown.find("\n## ", start + 1)
    body = markdown[start : end if end >= 0 else None]
    return re.findall(rf"^```{language}\n(.*?)^```$", body, flags=re.MULTILINE | re.DOTALL)


# -- the site ---------------------------------------------------------------------------


def test_every_page_of_the_nav_exists_and_is_built(site: Path) -> None:
    """Every nav entry is a page of docs/ and the reader finds it in the built site."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    pages = list(_nav_pages(config["nav"]))
    for wanted in ("index.md", "tutorial.md", "configuration.md", "plugins.md"):
        assert wanted in pages
    for wanted in ("wsgi.md", "frameworks.md", "servers.md", "reference/hooks.md"):
        assert wanted in pages
    for page in pages:
        assert (DOCS / page).is_file(), page
        assert _built(site, page).is_file(), page


def test_configuration_reference_lists_every_setting_with_its_variable_and_default(
    site: Path,
) -> None:
    """The site's settings table is generated from ``Settings`` at build time: one row per
    setting, in declaration order, with its ``OBLETH_*`` variable, default and doc line."""
    page = _read(_built(site, "configuration.md"))
    header = ["setting / variable", "default", "meaning"]
    (table,) = [table for table in page.tables if table and table[0] == header]
    rows = table[1:]
    specs = list(specs_of(Settings).values())
    assert [row[0].split() for row in rows] == [[spec.name, spec.env] for spec in specs]
    for row, spec in zip(rows, specs, strict=True):
        assert row[1] == _plain(shown_default(spec)), spec.name
        assert _words(row[2]) == _plain(spec.doc), spec.name


def test_hook_reference_has_every_hookspec_with_its_docstring(site: Path) -> None:
    """Each ``obleth_*`` hook has its own entry on the hook page, with its whole docstring."""
    built = _built(site, "reference/hooks.md")
    source = built.read_text(encoding="utf-8")
    text = _words(html.unescape("".join(_read(built).text)))
    assert hookspecs.HOOK_NAMES
    for name in hookspecs.HOOK_NAMES:
        assert f'id="gateway.hookspecs.{name}"' in source, name
        doc = inspect.getdoc(getattr(hookspecs, name))
        assert doc, f"{name} has no docstring"
        assert _plain(doc) in text, name


def test_api_reference_has_every_public_name(site: Path) -> None:
    """Everything ``gateway`` exports has an entry on the Python API page."""
    source = _built(site, "reference/api.md").read_text(encoding="utf-8")
    for name in gateway.__all__:
        assert f'id="gateway.{name}"' in source or f'id="gateway.errors.{name}"' in source, name


def test_the_site_loads_nothing_from_elsewhere(site: Path) -> None:
    """No web fonts and no script, style or image from another host: the site works
    offline and tells no third party who reads it."""
    outside = re.compile(r"<(?:script|link|img)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.I)
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text, page
        assert not outside.search(text), f"{page}: {outside.search(text)}"


# -- the plugin guide -------------------------------------------------------------------


def _without_docstrings(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body.pop(0)
    return ast.dump(tree)


def test_worked_example_shows_the_shipped_plugin_module() -> None:
    """The plugin module printed in the guide is the shipped example's, docstrings aside."""
    guide = (DOCS / "plugins.md").read_text(encoding="utf-8")
    shown = _fenced(guide, "A worked example")[0]
    module = EXAMPLE_PLUGIN / "src" / "obleth_example_capacity" / "plugin.py"
    assert _without_docstrings(shown) == _without_docstrings(module.read_text(encoding="utf-8"))


def test_the_kv_pressure_walkthrough_shows_the_shipped_provider() -> None:
    """The provider code the guide walks through is the shipped kv-pressure provider's,
    line for line and in order (docstrings and comments aside)."""
    guide = (DOCS / "plugins.md").read_text(encoding="utf-8")
    (shown,) = _fenced(guide, "A worked provider that reads the backends: `kv-pressure`")
    source = REPO / "plugins" / "obleth-kv-pressure" / "src" / "obleth_kv_pressure"
    shipped = iter((source / "provider.py").read_text(encoding="utf-8").splitlines())
    for line in (line for line in shown.splitlines() if line.strip()):
        assert any(candidate == line for candidate in shipped), f"not in provider.py: {line}"


def test_testing_a_plugin_snippet_is_the_example_test_and_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guide's test is the example plugin's own first test, and it passes as printed."""
    guide = (DOCS / "plugins.md").read_text(encoding="utf-8")
    (snippet,) = _fenced(guide, "Testing a plugin")
    shipped = (EXAMPLE_PLUGIN / "tests" / "test_fraction.py").read_text(encoding="utf-8")
    assert snippet in shipped
    monkeypatch.syspath_prepend(str(EXAMPLE_PLUGIN / "src"))
    for module in [name for name in sys.modules if name.startswith("obleth_example_capacity")]:
        monkeypatch.delitem(sys.modules, module)
    namespace: dict[str, object] = {}
    exec(compile(snippet, "docs/plugins.md", "exec"), namespace)  # noqa: S102 - our own docs
    tests = [value for name, value in namespace.items() if name.startswith("test_")]
    assert tests
    for test in tests:
        assert callable(test)
        test()


def test_no_doc_page_links_to_the_old_place_of_the_example_plugin() -> None:
    """The example plugin moved to plugins/: the docs point there."""
    for page in DOCS.rglob("*.md"):
        assert "plugin_dists/obleth-example-capacity" not in page.read_text(encoding="utf-8")


# -- the tutorial -----------------------------------------------------------------------


@pytest.mark.parametrize("page", ["tutorial.md", "index.md"])
def test_every_obleth_variable_a_page_names_is_a_setting(page: str) -> None:
    """A reader who copies an ``OBLETH_*`` variable from the tutorial gets a real setting
    (an unknown one stops the app at startup)."""
    named = set(re.findall(r"\bOBLETH_[A-Z0-9_]+", (DOCS / page).read_text(encoding="utf-8")))
    assert named
    assert named <= {spec.env for spec in specs_of(Settings).values()}


def test_the_tutorial_app_adds_the_middleware_in_one_line() -> None:
    """The tutorial serves examples/fastapi_app.py and says the middleware is its one line."""
    tutorial = (DOCS / "tutorial.md").read_text(encoding="utf-8")
    example = (REPO / "examples" / "fastapi_app.py").read_text(encoding="utf-8")
    assert "uvicorn examples.fastapi_app:app" in tutorial
    assert "\napp.add_middleware(GatewayMiddleware)\n" in example
    assert "GET /stats" in tutorial and '@app.get("/stats")' in example


# -- the build's hooks ------------------------------------------------------------------


def _hooks() -> ModuleType:
    """docs/hooks.py, loaded as MkDocs loads it: from its path."""
    spec = importlib.util.spec_from_file_location("obleth_docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_links_out_of_docs_point_at_the_repository_when_it_is_known() -> None:
    """On the site, a link to a repository file outside docs/ goes to the repository's
    copy (or, with no ``repo_url``, is shown as the path it names)."""
    hooks = _hooks()
    page = DOCS / "plugins.md"
    text = (
        "[the example](../plugins/obleth-example-capacity/) and "
        "[`examples/fastapi_app.py`](../examples/fastapi_app.py)"
    )
    linked = hooks.outside_links(text, page, DOCS, "https://example.org/obleth/")
    assert linked == (
        "[the example](https://example.org/obleth/tree/HEAD/plugins/obleth-example-capacity)"
        " and [`examples/fastapi_app.py`]"
        "(https://example.org/obleth/blob/HEAD/examples/fastapi_app.py)"
    )
    assert hooks.outside_links(text, page, DOCS, None) == (
        "the example (`plugins/obleth-example-capacity`) and `examples/fastapi_app.py`"
    )
    assert hooks.outside_links("[cluster](cluster.md#x)", page, DOCS, None) == (
        "[cluster](cluster.md#x)"
    )


def test_a_link_out_of_docs_to_nothing_fails_the_build() -> None:
    """A link to a path the repository does not hold stops the build, naming the page."""
    hooks = _hooks()
    with pytest.raises(MkDocsPluginError, match=re.escape("plugins.md: link to '../nowhere.py'")):
        hooks.outside_links("see [it](../nowhere.py)", DOCS / "plugins.md", DOCS, None)
