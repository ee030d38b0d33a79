"""The docs read as pages: every code line of README.md and docs/ fits the page's code column, and
the API reference page, built from the docstrings, shows no raw reST (``:class:``, ``:meth:``,
``:func:`` roles, ``::`` literal markers) and gives ``coci.plan`` an argument table.

The API page is built in-process with the repository's ``mkdocs.yml`` (strict: an unresolved
cross-reference or a malformed docstring section fails the build), into a temporary directory.
"""

from __future__ import annotations

import inspect
import logging
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

import coci

ROOT = Path(__file__).resolve().parents[1]
while not (ROOT / "pyproject.toml").is_file():  # the test's folder may move under tests/
    ROOT = ROOT.parent

#: The widest code line the page shows without clipping (Material's code column at its default font).
CODE_COLUMNS = 88

FENCE = re.compile(r"^\s*(```|~~~)")
SNIPPET = re.compile(r'^--8<--\s+"(?P<path>[^"]+)"\s*$')
RAW_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|exc|obj):")
LITERAL_MARKER = re.compile(r"\w::(?:\s|$)")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def wide_code_lines(text: str, source: str, columns: int = CODE_COLUMNS) -> list[str]:
    """``source:line: width`` for each line inside a fenced block of ``text`` wider than ``columns``,
    following ``--8<-- "path"`` includes (what the page shows)."""
    wide: list[str] = []
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        included = SNIPPET.match(line)
        if included and not inside:
            path = ROOT / included["path"]
            wide += wide_code_lines(path.read_text(encoding="utf-8"), included["path"], columns)
        elif FENCE.match(line):
            inside = not inside
        elif inside and len(line) > columns:
            wide.append(f"{source}:{number}: {len(line)} columns")
    return wide


def test_every_code_line_of_the_readme_and_docs_fits_the_page() -> None:
    wide = [line for path in markdown_files() for line in wide_code_lines(path.read_text(encoding="utf-8"), path.name)]
    assert not wide, f"code lines wider than {CODE_COLUMNS} columns (the page clips them):\n" + "\n".join(wide)


def test_the_width_check_sees_fenced_lines_only() -> None:
    text = "prose " * 40 + "\n\n```python\nx = 1\n" + "y" * 89 + "\n```\n\n" + "z" * 120 + "\n"
    assert wide_code_lines(text, "page.md") == ["page.md:5: 89 columns"]


#: The longest prose paragraph the docs keep as one block; a longer one becomes a list or sections.
PARAGRAPH_WORDS = 150

_NOT_PROSE = re.compile(r"^(\s|[-*+]\s|[|#>]|\d+\.\s|<!--|--8<--)")


def long_paragraphs(text: str, source: str, words: int = PARAGRAPH_WORDS) -> list[str]:
    """``source:line: N words`` for each prose paragraph of ``text`` longer than ``words``: a block
    of non-blank lines outside code blocks whose first line is not a list item, a table row, a
    heading, a quote, a comment or indented (a list item's continuation)."""
    found: list[str] = []
    block: list[str] = []
    start, inside = 0, False

    def flush() -> None:
        count = len(" ".join(block).split())
        if block and not _NOT_PROSE.match(block[0]) and count > words:
            found.append(f"{source}:{start}: {count} words")
        block.clear()

    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            flush()
            inside = not inside
        elif inside or not line.strip():
            flush()
        else:
            if not block:
                start = number
            block.append(line)
    flush()
    return found


def test_no_prose_paragraph_of_the_readme_and_docs_is_a_wall_of_text() -> None:
    long = [hit for path in markdown_files() for hit in long_paragraphs(path.read_text(encoding="utf-8"), path.name)]
    assert not long, f"paragraphs over {PARAGRAPH_WORDS} words (make them a list or sections):\n" + "\n".join(long)


def test_the_paragraph_check_counts_prose_only() -> None:
    prose = " ".join(["word"] * 151)
    text = f"# Title\n\n{prose}\n\n- {prose}\n\n```text\n{prose}\n```\n\n**Bold.** {prose}\n\nshort one\n"
    assert long_paragraphs(text, "page.md") == ["page.md:3: 151 words", "page.md:11: 152 words"]


class _PageText(HTMLParser):
    """The page's text outside ``<pre>`` and ``<code>``, one chunk per text node."""

    def __init__(self) -> None:
        super().__init__()
        self.prose: list[str] = []
        self._in_code = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("pre", "code"):
            self._in_code += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("pre", "code") and self._in_code:
            self._in_code -= 1

    def handle_data(self, data: str) -> None:
        if not self._in_code:
            self.prose.append(data)


def raw_rest(html: str) -> list[str]:
    """The raw reST the page's prose shows: roles and ``::`` literal markers, each with its context."""
    parser = _PageText()
    parser.feed(html)
    prose = "\n".join(parser.prose)
    found = [prose[max(0, m.start() - 40) : m.end() + 40] for m in RAW_ROLE.finditer(prose)]
    found += [prose[max(0, m.start() - 40) : m.end() + 10] for m in LITERAL_MARKER.finditer(prose)]
    return found


def test_the_raw_rest_check_finds_roles_and_literal_markers_in_prose_only() -> None:
    page = (
        "<p>See :class:<code>Plan</code> and :meth:<code>x</code>.</p><p>Usage::</p>"
        "<pre><code>order[r::world_size] :func:`f`</code></pre><p>a <code>b::c</code> is code</p>"
    )
    found = raw_rest(page)
    assert len(found) == 3, found


@pytest.fixture(scope="module")
def api_page(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The API reference page as built by mkdocs (strict) from the repository's ``mkdocs.yml``."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    docs = tmp_path_factory.mktemp("docs")
    (docs / "reference").mkdir()
    shutil.copy(ROOT / "docs" / "reference" / "api.md", docs / "reference" / "api.md")
    site = tmp_path_factory.mktemp("site")
    config = load_config(
        str(ROOT / "mkdocs.yml"), docs_dir=str(docs), site_dir=str(site), nav=[{"API": "reference/api.md"}], strict=True
    )
    level = logging.getLogger("mkdocs").level
    try:
        build(config)
    finally:
        logging.getLogger("mkdocs").setLevel(level)
    return (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")


@pytest.mark.slow  # builds the docs site (mkdocs, every page)
def test_the_api_page_shows_no_raw_rest(api_page: str) -> None:
    assert "coci.Session" in api_page
    found = raw_rest(api_page)
    assert not found, f"{len(found)} raw reST roles or :: markers on the API page:\n" + "\n".join(found[:20])


@pytest.mark.slow  # builds the docs site (mkdocs, every page)
def test_the_api_page_gives_coci_plan_an_argument_table(api_page: str) -> None:
    start = api_page.index('id="coci.plan"')
    section = api_page[start : api_page.index('class="doc doc-heading"', start + 100)]
    assert "<table" in section
    rows = set(re.findall(r"<td>\s*<code>(\w+)</code>\s*</td>", section))
    missing = set(inspect.signature(coci.plan).parameters) - rows
    assert not missing, f"coci.plan's arguments without a row in its table: {sorted(missing)}"


@pytest.mark.slow  # builds the docs site (mkdocs, every page)
def test_the_api_page_links_cross_references(api_page: str) -> None:
    """A docstring's ``[Name][coci.Name]`` becomes a link to the object's anchor."""
    assert re.search(r'<a [^>]*href="#coci\.(session\.)?Session"', api_page)
