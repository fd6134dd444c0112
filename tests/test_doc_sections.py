"""Every docs section the code cites (``docs/benchmarks.md, "Heading"``) exists.

Measured figures live in the docs, next to how they were measured; a comment or docstring
that rests on one cites the page and the section's heading instead of copying the number.
A heading renamed or a section removed fails here, naming the file and the citation.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("impl", "spec", "src", "proofs", "kernels")

#: ``docs/page.md, "Heading"`` (also with typographic quotes), whitespace-normalized.
_CITE = re.compile(r"docs/(?P<page>[\w/.-]+\.md),\s+[\"“](?P<heading>[^\"”]+)[\"”]")
_HEADING = re.compile(r"^#{1,6}\s+(?P<text>.+?)\s*$", re.MULTILINE)


def _flat(source: str) -> str:
    """``source`` with line breaks, comment markers and indentation folded to one space."""
    return re.sub(r"\s*\n\s*(?:#:?\s*)?", " ", source)


def citations(source: str) -> list[tuple[str, str]]:
    """(page, heading) for each docs section ``source`` cites."""
    return [(m["page"], m["heading"]) for m in _CITE.finditer(_flat(source))]


def headings(page: Path) -> set[str]:
    return {m["text"] for m in _HEADING.finditer(page.read_text(encoding="utf-8"))}


def test_every_cited_section_exists() -> None:
    cited = 0
    missing = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            for page, heading in citations(path.read_text(encoding="utf-8")):
                cited += 1
                doc = ROOT / "docs" / page
                if not doc.is_file() or heading not in headings(doc):
                    missing.append(f"{path.relative_to(ROOT)}: docs/{page}, {heading!r}")
    assert not missing, "\n".join(missing)
    assert cited >= 4  # the pool's and the record's notes cite their measurements


def test_a_citation_spans_lines_and_comment_markers() -> None:
    source = '    # see docs/benchmarks.md, "The full\n    # pool: eviction")\n'
    assert citations(source) == [("benchmarks.md", "The full pool: eviction")]
    assert citations('(docs/conformance.md, "Design differences").') == [
        ("conformance.md", "Design differences")
    ]
    assert citations("docs/benchmarks.md, section five") == []
