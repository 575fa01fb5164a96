"""The package's shape, read from its source with `ast`: no import circles, no import
that climbs back up the layers, code sent to the nodes imports only what it may, and the
notebooks and the CLI come in through the subpackages' front doors."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lab_utils"

# The layers, lowest first, as docs/DEVELOPING.md quotes them (a test checks the quote). A
# part imports only parts on lower layers: never a higher one, nor one on its own layer
# ("a, b"), except where a layer lists its parts in order ("a < b"): each may import those
# before it.
LAYERS = [
    "errors, known_failures, util, on_node",
    "config",
    "results",
    "cluster",
    "measure, kv",
    "forecast, serve",
    "checks, bench",
    "notebook, report",
    "runner < cli < __main__",
]


def _layer_numbers(layers: list[str]) -> dict[str, float]:
    """Each part's layer; parts listed in order get increasing fractions of theirs."""
    out = {}
    for n, line in enumerate(layers):
        ordered = line.split(" < ")
        for i, group in enumerate(ordered):
            out.update({part: n + i / len(ordered) for part in group.split(", ")})
    return out


LAYER = _layer_numbers(LAYERS)
# The top level of lab_utils: the entry points and the errors; everything else in a folder.
TOP_LEVEL = {"__init__", "__main__", "runner", "errors", "known_failures"}  # and cli/
# Sent as source over SSH before anything is deployed: the standard library only.
SENT_AS_SOURCE = ["lab_utils.on_node.proctools", "lab_utils.on_node.facts",
                  "lab_utils.on_node.dirs", "lab_utils.on_node.nixl_threads"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}


MODULES = _modules()
FRONT_DOOR_USERS = sorted(m for m in MODULES if m.startswith("lab_utils.cli"))  # its commands


def _targets(node: ast.AST) -> list[str]:
    """The modules an import statement names (a `from X import y` that names a submodule
    counts as importing the submodule)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES]
        return subs or [node.module]
    return []


def imports_of(name: str, *, every: bool = False) -> set[str]:
    """lab_utils modules that `name` imports, at any depth of its code (lazy ones too);
    `every`: all top-level module names, lab_utils or not."""
    tree = ast.parse(MODULES[name].read_text())
    found = set()
    for node in ast.walk(tree):
        for target in _targets(node):
            if every:
                found.add(target.split(".")[0])
            elif target.startswith("lab_utils.") or target == "lab_utils":
                found.add(target)
    return found


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _graph() -> dict[str, set[str]]:
    return {m: {t for t in imports_of(m) if t in MODULES and t != m} for m in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_part_has_a_layer():
    parts = {_part(m) for m in MODULES} - {""}
    assert parts <= set(LAYER), f"give these a layer in LAYERS: {sorted(parts - set(LAYER))}"


def test_the_top_level_holds_only_the_entry_points_and_the_errors():
    assert {p.stem for p in PACKAGE.glob("*.py")} == TOP_LEVEL


def layers_text() -> str:
    """The layers as docs/DEVELOPING.md quotes them, one numbered line each."""
    return "\n".join(f"{n}  {line}" for n, line in enumerate(LAYERS))


def test_the_docs_quote_the_layers():
    docs = (ROOT / "docs" / "DEVELOPING.md").read_text()
    assert f"```\n{layers_text()}\n```" in docs, (
        f"docs/DEVELOPING.md must quote LAYERS as:\n```\n{layers_text()}\n```")


def test_no_import_circles():
    assert _cycles(_graph()) == []


def test_no_import_climbs_up():
    bad = []
    for module, targets in _graph().items():
        here = _part(module)
        for target in targets:
            there = _part(target)
            if here and there and here != there and LAYER[there] >= LAYER[here]:
                bad.append(f"{module} -> {target}")
    assert bad == []


def test_package_modules_do_not_import_their_own_front_door():
    bad = [f"{m} -> {t}" for m, targets in _graph().items() for t in targets
           if MODULES[m].name != "__init__.py" and t == m.rsplit(".", 1)[0]
           and MODULES[t].name == "__init__.py"]
    assert bad == []


@pytest.mark.parametrize("module", SENT_AS_SOURCE)
def test_code_sent_to_nodes_is_standard_library_only(module):
    outside = {m for m in imports_of(module, every=True)
               if m not in sys.stdlib_module_names and m != "__future__"}
    assert outside == set()


def test_node_side_code_imports_only_node_side_code():
    for module in (m for m in MODULES if _part(m) == "on_node"):
        assert {t for t in imports_of(module) if _part(t) != "on_node"} == set(), module


def exported(package: str) -> set[str]:
    """The names a package's front door lists in `__all__`."""
    for node in ast.parse(MODULES[package].read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__"
                                                for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def _front_door_violations(targets: set[str]) -> list[str]:
    """Modules inside a subpackage reached past its front door (a submodule the front door
    exports in `__all__`, such as `lab_utils.kv.budget`, counts as the front door's)."""
    packages = {_module_name(p.parent / "__init__.py") for p in PACKAGE.glob("*/__init__.py")}
    return sorted(t for t in targets if t.rsplit(".", 1)[0] in packages
                  and t.rsplit(".", 1)[1] not in exported(t.rsplit(".", 1)[0]))


@pytest.mark.parametrize("module", FRONT_DOOR_USERS)
def test_cli_imports_front_doors(module):  # its own modules aside
    assert _front_door_violations({t for t in imports_of(module)
                                   if not t.startswith("lab_utils.cli")}) == []


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").glob("*.ipynb")),
                         ids=lambda p: p.stem[:2])
def test_notebooks_import_front_doors(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
    targets = set()
    for node in ast.walk(ast.parse(code)):
        targets |= {t for t in _targets(node) if t.startswith("lab_utils")}
    assert targets, "the notebook imports nothing from lab_utils"
    assert _front_door_violations(targets) == []


def test_the_checker_sees_a_circle_and_a_climb():
    """The checks above can fail: a made-up graph with a circle and an upward import."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert LAYER["cluster"] < LAYER["serve"]  # so serve -> cluster is allowed, not the reverse
    assert LAYER["forecast"] == LAYER["serve"]  # neither imports the other
    numbers = _layer_numbers(["a, b", "c < d, e < f"])
    assert numbers["a"] == numbers["b"] < numbers["c"] < numbers["d"] == numbers["e"] < numbers["f"]
