"""House rules the code keeps, checked so they do not drift: a module over 400 lines says
at its top why it is one file; every `type: ignore` says why on its line; the development
tools have one list (requirements-dev.txt), not a second one in pyproject.toml."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted((ROOT / "lab_utils").rglob("*.py"))


def test_a_long_module_says_why_it_is_one_file():
    long = {p: len(p.read_text().splitlines()) for p in MODULES}
    silent = [f"{p.relative_to(ROOT)} ({n} lines)" for p, n in long.items() if n > 400
              and not re.search(r"[Oo]ver 400 lines", ast.get_docstring(ast.parse(p.read_text())) or "")]
    assert not silent, f"over 400 lines without saying why at the top: {silent}"


def test_every_type_ignore_gives_its_reason():
    bare = [f"{p.relative_to(ROOT)}:{i}" for p in MODULES
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"type: ignore(\[[^\]]*\])?\s*$", line)]
    assert not bare, f"type: ignore without a reason after it: {bare}"


def test_the_development_tools_have_one_list():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "dev" not in project.get("optional-dependencies", {}), (
        "requirements-dev.txt lists the development tools; pyproject.toml keeps no second list")
    listed = (ROOT / "requirements-dev.txt").read_text()
    assert all(tool in listed for tool in ("pytest", "ruff", "mypy"))
