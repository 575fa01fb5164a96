"""House rules the code keeps, checked so they do not drift: a module over 400 lines says
at its top why it is one file; every `type: ignore` says why on its line; the development
tools have one list (requirements-dev.txt), not a second one in pyproject.toml; an import
inside a function is of a package on the short list below, each with its reason."""

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


# What a function may import where it needs it, and why it waits there. Everything else is
# imported at the top of its module. The code that runs on the nodes (on_node/) is apart:
# it is sent as source or started with the node's own Python, which may lack any of these.
LATE_IMPORTS = {
    "pandas": "tables only: the proxy, the nodes' commands and the CLI load the same modules "
              "and never build a frame (pandas takes about half a second to import)",
    "matplotlib": "plots only, in the notebooks",
    "IPython": "only inside a Jupyter kernel (the display, the cell hooks)",
    "nbformat": "only where a notebook file is read or executed",
    "nbclient": "only the runner executes notebooks",
    "jupyter_client": "only the runner starts kernels",
    "uvicorn": "only the process that serves starts a server",
    "vllm": "only where vLLM's own request rules or parser are loaded (its import takes "
            "seconds and a CUDA-free build on the rehearsal)",
    "pydantic": "vLLM's request models are pydantic: loaded with them",
    "nixl": "only where a NIXL agent is made (notebook 02's look under the hood)",
    "torch": "only when the tiny model's weights are made",
    "transformers": "only when the tiny model's weights are made",
    "tokenizers": "only when a tokenizer is built or loaded from a local directory",
    "huggingface_hub": "only when a model's config is fetched",
}


def test_an_import_inside_a_function_is_on_the_short_list():
    late = []
    for p in MODULES:
        if "on_node" in p.parts:
            continue
        for f in ast.walk(ast.parse(p.read_text())):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for n in ast.walk(f):
                    if isinstance(n, (ast.Import, ast.ImportFrom)):
                        names = ([a.name for a in n.names] if isinstance(n, ast.Import)
                                 else [n.module or "."])
                        late += [f"{p.relative_to(ROOT)}:{n.lineno} {m}" for m in names
                                 if m.split(".")[0] not in LATE_IMPORTS]
    assert not late, f"imported inside a function, not on LATE_IMPORTS: {late}"
