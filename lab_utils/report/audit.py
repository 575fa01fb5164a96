"""The audit of what a run says: every saved claim (`claims.json`) checked again against
the results files, and every result sentence in the executed notebooks and the report
looked up among the claims.

A claim is false when a comparison behind it gives another verdict by the lab's rule
today, or when its numbers are not the results' (`claims.check`). A result sentence is a
line of a notebook's printed output or of report.md that quotes a number beside a word of
comparison (`RESULT`), other than a statement of the rule itself (`METHOD`); it is unbacked when no saved claim's sentence holds it (or it one).
`python -m lab_utils audit [RESULTS_DIR]` prints both lists and the tally; `make lab` runs
it last.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab_utils.errors import LabError
from lab_utils.forecast.grade import grade_rows, summary
from lab_utils.results import RESULTS, load_envelope
from lab_utils.results.claims import CLAIMS_FILE, Claim, Graded, check, load_claims
from lab_utils.results.points import Point

# a number beside a word that compares or judges
RESULT = re.compile(r"\d.*\b(won|wins|lost|beat|better|worse|higher|lower|faster|slower|rose|"
                    r"fell|added|protected|paid|expected|differ\w*|best|same as|"
                    r"\d+(\.\d+)?x)\b|\b(won|wins|lost|beat|better|worse|higher|lower|faster|"
                    r"slower|rose|fell|protected|paid|expected|best)\b.*\d", re.IGNORECASE)
BULLET = re.compile(r"^\s*(?:[-*]|\d+\.)\s+")
# how the lab judges, not what it found: the paragraphs that state the rule
METHOD = "a difference counts only when"


@dataclass
class Audit:
    """What the audit found: claims checked (they carry comparisons), claims only backed
    (figures the results cannot re-derive), false ones with why, and unbacked sentences
    with where they were read."""

    checked: int = 0
    backed: int = 0
    false: list[tuple[Claim, list[str]]] = field(default_factory=list)
    unbacked: list[tuple[str, str]] = field(default_factory=list)

    @property
    def tally(self) -> str:
        return (f"{self.checked} claims checked, {len(self.false)} false, "
                f"{len(self.unbacked)} unbacked sentences ({self.backed} more claims quote "
                "figures the results files cannot re-derive)")

    @property
    def ok(self) -> bool:
        return not self.false and not self.unbacked

    def lines(self) -> list[str]:
        out = [f"FALSE ({c.where}): {c.text}\n    " + "\n    ".join(why)
               for c, why in self.false]
        out += [f"UNBACKED ({where}): {text}" for where, text in self.unbacked]
        return out + [self.tally]


def _payloads(results_dir: Path) -> dict[str, Any]:
    """Every notebook's payload found in `results_dir`."""
    return {nb: load_envelope(results_dir / spec.file_name).payload
            for nb, spec in RESULTS.items() if (results_dir / spec.file_name).is_file()}


def _points(payloads: dict[str, Any]) -> dict[tuple[str, str, str, float], Point]:
    """Every valid combined point of every serving notebook's results."""
    out: dict[tuple[str, str, str, float], Point] = {}
    for nb, payload in payloads.items():
        for run in ("sweep", "mixed"):
            result = getattr(payload, run, None)
            for p in getattr(result, "combined", None) or []:
                if p.valid:
                    out[(nb, run, p.mode, float(p.value))] = p
        policies = getattr(payload, "policies", None)
        for name, p in (policies.runs.items() if policies else ()):
            out[(nb, f"policy {name}", p.mode, float(p.value))] = p
        switches = getattr(payload, "switches", None)
        for r in switches.chunked_prefill if switches else []:
            out[(nb, f"switch {r.suffix}", r.point.mode, float(r.point.value))] = r.point
    return out


def check_graded(g: Graded, payloads: dict[str, Any]) -> list[str]:
    """What is wrong with a stated forecast grade against the notebook's results: the
    forecast graded again against its sweep and mixed run."""
    payload = payloads.get(g.notebook)
    fc = getattr(payload, "forecast", None)
    if payload is None or fc is None:
        return [f"no forecast in notebook {g.notebook}'s results"]
    rows = grade_rows(fc, {"standard": payload.sweep, "mixed": payload.mixed},
                      not_graded=getattr(payload, "not_graded", None))
    if g.tally is not None:
        now = summary(rows)
        return [f"forecast of {g.notebook}, {k}: the claim says {v}, the results give {now[k]}"
                for k, v in g.tally.items()
                if not (v == now[k] or (isinstance(v, float) and isinstance(now[k], float)
                                        and math.isclose(v, now[k], rel_tol=1e-6)))]
    row = next((r for r in rows if (r.workload, r.load, r.metric)
                == (g.workload, g.load, g.metric)), None)
    if row is None or not row.graded:
        return [f"forecast of {g.notebook}: {g.metric} at {g.load} ({g.workload}) not graded"]
    if row.inside != g.inside:
        return [f"forecast of {g.notebook}: {g.metric} at {g.load} ({g.workload}) is "
                f"{'inside' if row.inside else 'outside'} its interval, the claim "
                f"says {'inside' if g.inside else 'outside'}"]
    return []


def _norm(text: str) -> str:
    return " ".join(BULLET.sub("", text).replace("Verdict: ", "").split()).strip(" .")


def _notebook_output(path: Path) -> list[str]:
    """What a notebook printed as text: its streams and plain displays (not tables)."""
    nb = json.loads(path.read_text())
    out = []
    for cell in nb.get("cells", []):
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream" and o.get("name") == "stdout":
                text = "".join(o.get("text", ""))
            elif "text/html" not in o.get("data", {}) and "image/png" not in o.get("data", {}):
                text = "".join(o.get("data", {}).get("text/plain", ""))
            else:
                continue
            out += text.splitlines()
    return out


def _report_prose(path: Path) -> list[str]:
    """report.md's prose lines (not its tables, headings or images)."""
    return [line for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith(("|", "#", "![", "*"))]


def result_sentences(results_dir: Path) -> list[tuple[str, str]]:
    """(where, line) for every line that states a result (`RESULT`) in the executed
    notebooks and report.md."""
    found = []
    for path in sorted((results_dir / "executed").glob("*.ipynb")):
        found += [(path.stem, line) for line in _notebook_output(path)]
    if (report := results_dir / "report.md").is_file():
        found += [("report", line) for line in _report_prose(report)]
    return [(w, line.strip()) for w, line in found
            if RESULT.search(line) and METHOD not in line]


def audit(results_dir: str | Path) -> Audit:
    """Check every saved claim against the results files, and look up every result sentence
    among the claims."""
    results_dir = Path(results_dir)
    if not (results_dir / CLAIMS_FILE).is_file():
        raise LabError(f"no {CLAIMS_FILE} in {results_dir}: run the notebooks (make lab) or "
                       "name the profile's results directory")
    book = load_claims(results_dir)
    payloads = _payloads(results_dir)
    points = _points(payloads)
    found = Audit()
    texts = []
    for claims in book.values():
        for c in claims:
            texts.append(_norm(c.text))
            if not c.checkable:
                found.backed += 1
                continue
            found.checked += 1
            why = check(c, points) + [w for g in c.graded for w in check_graded(g, payloads)]
            if why:
                found.false.append((c, why))
    for where, line in result_sentences(results_dir):
        n = _norm(line)
        if n and not any(n in t or (t and t in n) for t in texts):
            found.unbacked.append((where, line))
    return found
