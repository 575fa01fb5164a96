"""The hostile-config corpus: bad configs a workshop attendee (or a hostile colleague)
could write, each refused by every CLI entry point before any process starts or any
remote command runs, with its message and no traceback, leaving no state behind.

Each case in tests/fixtures/hostile-configs/ is a small diff from a shipped profile:
`set` maps a dotted field to a value (a value "@other.field" copies that field),
`text_replace` edits the file's text (for JSON mistakes; in its replacement "@DEEP@"
stands for a list nested 200,000 deep and "@DIGITS@" for a 5,000-digit number),
`encoding` is the one the file is written in (UTF-8 unless it says), `expect` lists
fragments the message must contain and `absent` fragments (a secret) it must not.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest

from lab_utils import cli
from lab_utils.config import REPO_ROOT

CORPUS = Path(__file__).parents[1] / "fixtures" / "hostile-configs"
CASES = sorted(CORPUS.glob("*.json"))

# Every entry point that takes --config; the bench's URL is a closed loopback port.
COMMANDS = [
    ["serve", "--topology", "disaggregated"],
    ["serve", "--topology", "baseline", "--dry-run", "--offline"],
    ["proxy", "--mode", "disaggregated"],
    ["check"], ["status"], ["cleanup"], ["deploy"], ["model", "fetch"], ["report"],
    ["demo"], ["run"], ["lab"],
    ["bench", "--url", "http://127.0.0.1:9", "--out", "{tmp}/bench.json"],
]


def _walk(data: dict, dotted: str) -> tuple[dict, str]:
    *parents, last = dotted.split(".")
    for key in parents:
        data = data[key]
    return data, last


def build_case(case_file: Path, tmp: Path) -> tuple[Path, list[str]]:
    """Write the case's config into `tmp` (results under `tmp/results`); return its path
    and the expected fragments."""
    case = json.loads(case_file.read_text())
    text = (REPO_ROOT / case["base"]).read_text()
    if "text_replace" in case:
        old, new = case["text_replace"]
        new = new.replace("@DEEP@", "[" * 200_000 + "]" * 200_000).replace("@DIGITS@", "9" * 5000)
        assert old in text, f"{case_file.name}: the text to replace is not in {case['base']}"
        text = text.replace(old, new).replace('"results_root": "results"',
                                              json.dumps({"results_root": str(tmp / "results")})[1:-1])
    else:
        data = json.loads(text)
        data["results_root"] = str(tmp / "results")
        for dotted, value in case["set"].items():
            if isinstance(value, str) and value.startswith("@"):
                parent, key = _walk(data, value[1:])
                value = parent[key]
            parent, key = _walk(data, dotted)
            assert key in parent or dotted.endswith(("extra_env", "extra_args", "revision", "_file")), \
                f"{case_file.name}: {dotted} is not a field of {case['base']}"
            parent[key] = value
        text = json.dumps(data, indent=2)
    path = tmp / "config.json"
    path.write_bytes(text.encode(case.get("encoding", "utf-8")))
    return path, case["expect"]


def absent(case_file: Path) -> list[str]:
    return json.loads(case_file.read_text()).get("absent", [])


def test_the_corpus_covers_each_kind_of_mistake():
    names = {c.stem.split("-", 1)[1] for c in CASES}
    assert len(CASES) >= 25
    for must in ("wildcard-lan", "kv-over-lan", "loopback-on-ssh-node", "workdir-semicolon",
                 "relative-python", "dtype-substitution", "results-in-etc",
                 "derived-port-past-65535", "env-name-with-equals", "newline-in-value",
                 "api-key-on-argv", "trailing-comma", "windows-path", "hostname-as-address",
                 "duplicate-port", "role-not-held"):
        assert must in names


@pytest.mark.parametrize("case_file", CASES, ids=[c.stem for c in CASES])
def test_refused_by_every_entry_point(case_file, tmp_path, capsys, no_node_reached):
    config, expect = build_case(case_file, tmp_path)
    for argv in COMMANDS:
        argv = [a.format(tmp=tmp_path) for a in argv]
        rc = cli.main([*argv, "--config", str(config)])
        out = capsys.readouterr()
        said = out.err + out.out
        assert rc == 2, f"{argv[0]}: exit {rc}, not refused:\n{said}"
        for fragment in expect:
            assert fragment in said, f"{argv[0]}: {fragment!r} not in:\n{said}"
        for fragment in absent(case_file):
            assert fragment not in said, f"{argv[0]}: {fragment!r} shown in:\n{said}"
        assert "Traceback" not in said
    assert no_node_reached == []
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["config.json"], f"state left behind: {left}"


def test_a_refused_config_prints_no_traceback_from_a_real_process(tmp_path):
    """The in-process runs above, once for real: the messages reach a terminal as is."""
    import sys

    config, expect = build_case(CORPUS / "08-workdir-semicolon.json", tmp_path)
    p = subprocess.run([sys.executable, "-m", "lab_utils", "serve", "--topology", "baseline",
                        "--config", str(config)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert all(f in p.stderr for f in expect) and "Traceback" not in p.stderr + p.stdout


CANARY = "sk-canary-pasted-key-0b7e51d9"


@pytest.mark.parametrize("field", ["proxy.api_key_file", "vllm.api_key_file"])
def test_a_key_pasted_where_its_file_goes_is_shown_by_no_command(field, tmp_path, capsys,
                                                                  no_node_reached):
    """The config is valid (a file name), so each command gets as far as it gets; the key
    appears in none of their output."""
    case = {"base": "configs/local-cpu.json", "set": {field: CANARY}, "expect": []}
    (tmp_path / "case.json").write_text(json.dumps(case))
    config, _ = build_case(tmp_path / "case.json", tmp_path)
    for argv in [["serve", "--topology", "disaggregated"], ["proxy", "--mode", "disaggregated"],
                 ["serve", "--topology", "baseline", "--dry-run", "--offline"], ["check"],
                 ["bench", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "b.json")]]:
        with contextlib.suppress(AssertionError):  # no_node_reached refused a process
            cli.main([*argv, "--config", str(config)])
        out = capsys.readouterr()
        assert CANARY not in out.err + out.out, argv
