"""Sphinx configuration for the prefixkv documentation (MyST markdown + autodoc).

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html``. The build needs no
network: no intersphinx, no remote images. ``tests/test_docs.py`` builds it with warnings as
errors and runs every Python example in the pages.
"""

from __future__ import annotations

import os

# The kernel modules decorate Triton kernels at import; under the interpreter that works on
# a machine without a GPU, which is what CI and most docs builds have.
os.environ.setdefault("TRITON_INTERPRET", "1")

project = "prefixkv"
author = "prefixkv contributors"
copyright = "prefixkv contributors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# bench/ holds generated artifacts (JSON, plots, and the GPU benchmark's own markdown
# table); pages include what they need from it, it is not a page tree of its own.
exclude_patterns = ["_build", "bench/*.md", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
# Headings become link targets, so pages can link to sections: [x](design.md#identity).
myst_heading_anchors = 3

autodoc_default_options = {
    "members": True,
    "undoc-members": False,
    "show-inheritance": True,
    "member-order": "bysource",
}
# Type hints go into the parameter list rather than the signature line: attrs classes and
# the kernels' launchers have long signatures that would not fit on one line.
autodoc_typehints = "description"
autodoc_typehints_format = "short"
napoleon_google_docstring = False
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = "prefixkv"
html_static_path: list[str] = []
