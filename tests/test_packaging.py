"""The lab as a Python package: its declared dependencies match requirements.txt, and a
wheel installs the package with its console script, whose paths into the checkout fail
with a message that says what to do (a wheel carries no notebooks or profiles)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _names(specs: list[str]) -> dict[str, str]:
    return {re.split(r"[<>=!~ ;\[]", s, maxsplit=1)[0].lower(): s.replace(" ", "") for s in specs}


def test_declared_dependencies_match_requirements_txt():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    assert _names(project["dependencies"]) == _names([x for x in lines if x])
    assert project["scripts"]["spark-lab"] == "lab_utils.cli:main"
    assert project["license"] == "Apache-2.0" and (ROOT / "LICENSE").is_file()


@pytest.fixture(scope="module")
def wheel_install(tmp_path_factory) -> Path:
    """The lab built as a wheel and unpacked into a folder of its own (no checkout around it)."""
    out = tmp_path_factory.mktemp("wheel")
    # built from a copy: setuptools leaves build/ in the tree it builds, and a stale build/
    # would carry deleted modules into the next wheel made from the checkout
    src = out / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "results", "models", "build", "*.egg-info", "__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out),
                        str(src)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    wheel = next(out.glob("spark_disagg_lab-*.whl"))
    target = out / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(target)
        names = z.namelist()
    assert "lab_utils/report/__init__.py" in names and "lab_utils/on_node/proctools.py" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "spark-lab = lab_utils.cli:main" in (target / entry).read_text()
    return target


def _run_from(site: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LAB_CONFIG"}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_wheel_without_checkout_says_what_to_do(wheel_install, tmp_path):
    code = ("import lab_utils;"
            "from lab_utils.config import find_config_path, in_checkout;"
            "print(lab_utils.__file__); print(in_checkout()); find_config_path()")
    r = _run_from(wheel_install, code, tmp_path)
    assert r.stdout.splitlines()[0].startswith(str(wheel_install)), r.stdout + r.stderr
    assert r.stdout.splitlines()[1] == "False"
    assert "LabError" in r.stderr and "pip install -e ." in r.stderr and "--config" in r.stderr


def test_wheel_runs_with_an_explicit_config(wheel_install, tmp_path):
    config = (ROOT / "configs" / "local-cpu.json").read_text()
    (tmp_path / "profile.json").write_text(config)
    code = ("from lab_utils.config import load_config;"
            "cfg = load_config('profile.json'); print(cfg.profile)")
    r = _run_from(wheel_install, code, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "local-cpu"
