"""Optional parts of the notebooks: what a pair behind time leaves out.

A code cell tagged `optional` (Jupyter's cell tags) belongs to a part the workshop can do
without: 01's two switches, 04's router and split-model sections. `python -m lab_utils run
--skip-optional` runs instead the cell's `skipped_as` metadata (the names later cells read,
set to None) and a line saying it was left out; the runner records no time for it, and
the ETAs leave it out (`timings.optional_seconds` says what each part saves).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

OPTIONAL, SKIPPED = "optional", "skipped_optional"


def read_book(path: Path) -> Any:
    """The notebook at `path` (nbformat), read again only when the file changed."""
    return _read(str(path), path.stat().st_mtime)


@functools.lru_cache(maxsize=16)
def _read(path: str, mtime: float) -> Any:
    import nbformat

    return nbformat.read(path, as_version=4)


def optional_parts(book: Any) -> dict[str, list[str]]:
    """The optional code cells of a notebook, grouped under the `## ` heading above them."""
    out: dict[str, list[str]] = {}
    heading = ""
    for c in book.cells:
        if c.cell_type == "markdown" and c.source.startswith("## "):
            heading = c.source.splitlines()[0].removeprefix("## ").strip()
        elif c.cell_type == "code" and OPTIONAL in c.get("metadata", {}).get("tags", []):
            out.setdefault(heading, []).append(c["id"])
    return out


def skip_optional(book: Any) -> list[str]:
    """Put each optional cell's stand-in in its place (in `book`, an nbformat notebook about
    to run), marked so its time is not recorded; the headings of the parts left out."""
    parts = optional_parts(book)
    left = {cid: heading for heading, ids in parts.items() for cid in ids}
    for c in book.cells:
        if c.cell_type == "code" and c.get("id") in left:
            stand_in = c.get("metadata", {}).get("skipped_as", "")
            c.source = (f"{stand_in}\n" if stand_in else "") + (
                f"print({'skipped (run --skip-optional): ' + left[c['id']]!r})")
            c.metadata[SKIPPED] = True
    return list(parts)
