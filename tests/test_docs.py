"""The documentation builds without a warning, and every Python example in it runs.

Sphinx builds docs/ with warnings as errors (``-W --keep-going``) into a temporary
directory. Every fenced ```python block of docs/*.md and README.md is then run: the blocks
of one page in order, in one namespace (a page's later examples build on its earlier ones),
in a fresh interpreter started at the repository root. A block whose previous non-blank line
is ``<!-- skip-test -->`` is not run; the marker is for examples that need a GPU or take
minutes, and ``MAX_SKIPPED`` keeps it rare.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SKIP_MARKER = "<!-- skip-test -->"
#: Skipped examples, over all pages. Raising it needs a reason in the page, next to the block.
MAX_SKIPPED = 2

_FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^`\n]*)$")


@attrs.frozen
class Example:
    path: Path
    line: int  # 1-based line of the first code line
    code: str
    skipped: bool

    @property
    def shown_path(self) -> str:
        return str(self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path)

    @property
    def where(self) -> str:
        return f"{self.shown_path}:{self.line}"


def extract_examples(path: Path) -> list[Example]:
    """The ```python blocks of a markdown file, in order (indented ones dedented)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, info = m["indent"], m["info"].strip()
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != f"{indent}```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{path}:{i + 1}: unterminated code fence")
        if info == "python":
            prev = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
            code = textwrap.dedent("\n".join(lines[i + 1 : end]))
            found.append(Example(path, i + 2, code + "\n", prev == SKIP_MARKER))
        i = end + 1
    return found


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


# Runs in a fresh interpreter. Each example is compiled as its page, padded to its line, so
# a traceback names the page and the line of the docs that failed.
_RUNNER = """
import json, sys
namespace = {"__name__": "__docs_example__"}
for path, line, code in json.load(sys.stdin):
    print(f"--- running {path}:{line}", flush=True)
    exec(compile("\\n" * (line - 1) + code, path, "exec"), namespace)
"""


def run_examples(examples: list[Example], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env["TRITON_INTERPRET"] = "1"  # the kernel example runs on the CPU interpreter in CI
    env.pop("PREFIXKV_CHECK_INVARIANTS", None)  # examples opt in with enabled=True
    payload = json.dumps([(ex.shown_path, ex.line, ex.code) for ex in examples if not ex.skipped])
    return subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=payload,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
        check=False,
    )


PAGES_WITH_EXAMPLES = [p for p in pages() if any(not ex.skipped for ex in extract_examples(p))]


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=lambda p: p.name)
def test_examples_run(page: Path) -> None:
    examples = extract_examples(page)
    proc = run_examples(examples)
    assert proc.returncode == 0, f"an example of {page.name} failed:\n{proc.stdout}{proc.stderr}"
    ran = proc.stdout.count("--- running ")
    assert ran == sum(not ex.skipped for ex in examples)


def test_examples_are_found_and_skips_are_rare() -> None:
    """The pages that must carry runnable examples do, and few examples are skipped."""
    by_page = {p.name: extract_examples(p) for p in pages()}
    for name in ("README.md", "quickstart.md", "domain.md", "invariants.md", "conformance.md",
                 "kernels.md"):  # fmt: skip
        assert any(not ex.skipped for ex in by_page[name]), name
    skipped = [ex.where for exs in by_page.values() for ex in exs if ex.skipped]
    assert len(skipped) <= MAX_SKIPPED, skipped


def test_a_broken_example_fails(tmp_path: Path) -> None:
    """The runner reports a failing block with its page and line, and honours the marker."""
    page = tmp_path / "page.md"
    page.write_text(
        "# t\n\n```python\nx = 1\n```\n\n<!-- skip-test -->\n```python\nraise SystemExit(3)\n"
        "```\n\n- item\n\n  ```python\n  assert x == 2, 'x is 1'\n  ```\n\n```bash\nexit 1\n```\n",
        encoding="utf-8",
    )
    examples = extract_examples(page)
    assert [(ex.line, ex.skipped) for ex in examples] == [(4, False), (9, True), (15, False)]
    proc = run_examples(examples)
    assert proc.returncode != 0
    assert "x is 1" in proc.stderr and f'File "{page}", line 15' in proc.stderr


def test_docs_build_without_warnings(tmp_path: Path) -> None:
    """``sphinx-build -W --keep-going``: any warning (a broken link, a docstring that does
    not parse, a page outside the toctree) fails the build; every warning is listed."""
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run(
        [
            sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
            "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
        check=False,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "WARNING" not in output, output
    for page in ("index", "quickstart", "domain", "invariants", "conformance", "kernels",
                 "benchmarks", "api/spec", "api/conformance"):  # fmt: skip
        assert (tmp_path / "html" / f"{page}.html").is_file(), page
    api = (tmp_path / "html" / "api" / "spec.html").read_text(encoding="utf-8")
    assert "SpecCache" in api and "InvariantViolation" in api  # autodoc ran
    assert (tmp_path / "html" / "_images" / "cache_per_block.png").is_file()
