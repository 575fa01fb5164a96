"""Durability of the results chain: a results JSON is never torn.

Writer processes write notebook 01's results file through `lab_utils.results.write_results`
with a payload of several MB (a blob that encodes the run's number), and the test SIGKILLs
them: at random moments over many trials, and at each step of one write (inside the
archive copy, between archive and write, before and after the rename). After every kill:

- the results file is the previous complete run or the new complete run, readable by
  `load_results`, never missing and never a mix;
- history/ still holds the run before the current one (archiving copies, it never moves);
- a later normal write succeeds, and the temp files the killed writer left behind
  (`.<name>.<pid>.<random>.tmp`) confuse neither `load_results` nor a history listing;
- those temp files are removed by a later write once their writer is gone and they are
  old enough, and never while they are fresh or their writer lives.

The random trials count the kills that landed mid-write (the killed writer left a temp
file behind) and fail if too few did, so the test cannot pass without testing anything.

Writers are forked from one server process that has imported lab_utils once, so a trial
costs a fork, not an interpreter start. Each writer runs in its own process group, and
the test kills it by that group.
"""

from __future__ import annotations

import inspect
import os
import random
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from lab_utils import results
from lab_utils.config import REPO_ROOT
from lab_utils.util import atomic

BLOB_BYTES = 3 * 2**20  # a write of this size takes tens of ms: long enough to interrupt
TRIALS = 30
MIN_MID_WRITE = 5  # of TRIALS, kills that must land between temp file and rename
FILE = "baseline_metrics.json"


def blob_for(seq: int) -> str:
    """The large part of run `seq`'s payload: distinct for each run, checkable in full."""
    return f"{seq:08d}:" * (BLOB_BYTES // 9)


def payload_for(seq: int):
    """Notebook 01's results carrying run `seq` and its blob (in the sweep's workload)."""
    from lab_utils.results import BaselinePayload
    from lab_utils.results.sweep import BenchmarkResult

    sweep = BenchmarkResult(target="t", model="m", workload={"seq": seq, "blob": blob_for(seq)},
                            points=[], combined=[])
    return BaselinePayload(topology="baseline", instances=[], sweep=sweep, single_request=None,
                           roofline=None, reference=None)


SERVER_MAIN = r"""
import os, signal, sys
from lab_utils.util import atomic
from pathlib import Path
from lab_utils.config import load_config
from lab_utils.results import write_results

hold_at = "none"

def say(*words):
    # one write of the whole line: print() writes each word and separator on its own,
    # and under PYTHONUNBUFFERED (as `make test` runs) each is its own write(2), so a
    # kill between them left half a line ("temp" without its newline)
    sys.stdout.write(" ".join(map(str, words)) + "\n")
    sys.stdout.flush()

def step(path):
    return "archive" if Path(path).parent.name == "history" else "results"

def hold(point):
    if point == hold_at:
        say("held", point)
        os.read(0, 1)  # the test SIGKILLs us here; EOF means the test is gone
        os._exit(3)

real_create_temp, real_replace = atomic._create_temp, os.replace

def create_temp(*args, **kwargs):  # announce each temp file as soon as it exists
    fd, name = real_create_temp(*args, **kwargs)
    say("temp", step(name))
    return fd, name

def replace(src, dst):  # the rename that publishes a temp file: archive copy or results
    hold(f"before-{step(dst)}-replace")
    real_replace(src, dst)
    hold(f"after-{step(dst)}-replace")

atomic._create_temp, os.replace = create_temp, replace  # as atomic_write_bytes calls them

def writer(config_file, first):
    os.setsid()  # its own process group, which the test kills
    cfg = load_config(config_file)
    say("ready", os.getpid())
    seq = first
    while True:  # until killed (a closed pipe ends it too)
        say("begin", seq)
        write_results(cfg, "01", payload_for(seq), software={}, hardware={})
        say("done", seq)
        seq += 1

for command in sys.stdin:  # "<config file> <first run> <hold point or none>", one at a time
    config_file, first, hold_at = command.rstrip("\n").rsplit(" ", 2)
    pid = os.fork()
    if pid == 0:
        try:
            writer(config_file, int(first))
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    say("exited", pid, os.waitstatus_to_exitcode(status))
"""
SERVER = (f"BLOB_BYTES = {BLOB_BYTES}\n" + textwrap.dedent(inspect.getsource(blob_for))
          + textwrap.dedent(inspect.getsource(payload_for)) + SERVER_MAIN)


# --- helpers ---------------------------------------------------------------------------


class Writers:
    """The fork server and the one writer it runs at a time."""

    def __init__(self):
        self.server = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
        self.pid: int | None = None  # the running writer, also its process group
        self._fd, self._buffer = self.server.stdout.fileno(), b""

    def start(self, config_file: Path, first: int, hold: str = "none") -> list[str]:
        """Fork a writer that writes runs first, first + 1, ...; return its lines up to
        "ready" (it has loaded the config and is about to write)."""
        assert self.pid is None, "one writer at a time"
        self.server.stdin.write(f"{config_file} {first} {hold}\n".encode())
        self.server.stdin.flush()
        lines = self.read_until("ready")
        self.pid = int(lines[-1].split()[1])
        return lines

    def read_until(self, wanted: str, timeout: float = 60.0) -> list[str]:
        """Lines up to and including the first that is `wanted` or starts with `wanted `
        (a handshake through the pipe: no sleeping)."""
        lines, deadline = [], time.monotonic() + timeout
        while True:
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._fd], [], [], left)[0]:
                    pytest.fail(f"no {wanted!r} from the writers within {timeout} s: {lines}")
                chunk = os.read(self._fd, 65536)
                if not chunk:
                    pytest.fail(f"writer server exited before {wanted!r}: {lines}")
                self._buffer += chunk
            line, self._buffer = self._buffer.split(b"\n", 1)
            lines.append(line.decode())
            if lines[-1] == wanted or lines[-1].startswith(wanted + " "):
                return lines

    def kill(self) -> list[str]:
        """SIGKILL the writer's process group; return what it printed before it died."""
        pid, self.pid = self.pid, None
        os.killpg(pid, signal.SIGKILL)
        lines = self.read_until(f"exited {pid}")
        assert lines.pop() == f"exited {pid} {-signal.SIGKILL}"
        return lines

    def close(self) -> None:
        if self.pid is not None:
            self.kill()
        self.server.stdin.close()  # the server's loop ends
        try:
            self.server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait(timeout=10)
        self.server.stdout.close()


@pytest.fixture(scope="module")
def server():
    writers = Writers()
    yield writers
    writers.close()


@pytest.fixture
def writers(server):
    """The module's writer server; a writer a failed test left running is killed."""
    yield server
    if server.pid is not None:
        server.kill()


@pytest.fixture
def config_file(test_cfg, tmp_path) -> Path:
    """The profile file behind `test_cfg` (conftest writes it), for the writers to load."""
    path = tmp_path / "profile.json"
    assert path.exists()
    return path


def write(cfg, seq: int) -> None:
    results.write_results(cfg, "01", payload_for(seq), software={}, hardware={})


def check_intact(env: results.ResultsEnvelope) -> int:
    """The run number of a complete, correct envelope (asserts the whole blob)."""
    seq = env.payload.sweep.workload["seq"]
    assert env.payload == payload_for(seq)
    return seq


def current_seq(cfg) -> int:
    return check_intact(results.load_results(cfg, "01"))


def history_seqs(cfg, known: dict[Path, int] | None = None) -> dict[Path, int]:
    """Run number of every history file (a listing by *.json), each checked to be intact;
    files already in `known` are not read again."""
    known = {} if known is None else known
    files = sorted((cfg.results_dir / "history").glob("*.json"))
    return {p: known[p] if p in known else check_intact(results.load_envelope(p)) for p in files}


def temps_of(cfg, pid: int) -> list[Path]:
    """Temp files left by writer `pid` for the results file or a history copy of it:
    `.baseline_metrics[.<stamp>].json.<pid>.<random>.tmp`."""
    name = re.compile(rf"\.baseline_metrics\.(.+\.)?json\.{pid}\.[a-z0-9_]+\.tmp")
    dirs = (cfg.results_dir, cfg.results_dir / "history")
    return [p for d in dirs for p in sorted(d.iterdir()) if name.fullmatch(p.name)]


def backdate(paths: list[Path]) -> None:
    old = time.time() - 2 * atomic.STALE_TEMP_AGE_S
    for p in paths:
        os.utime(p, (old, old))


def dead_pid() -> int:
    """The PID of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=10)
    return proc.pid


# --- tests -----------------------------------------------------------------------------


def test_random_kills_never_tear_results(test_cfg, config_file, writers):
    """Kill a looping writer at seeded random moments (early, anywhere in a write, just
    after a temp file appeared): the results file is always a complete old or new run,
    history always has the run before it, and the leftovers are harmless, then removed."""
    cfg, rng = test_cfg, random.Random(20240611)
    path = cfg.results_dir / FILE
    write(cfg, 1)
    t0 = time.perf_counter()
    write(cfg, 2)  # archives run 1: one full write, timed to spread the random kills
    write_s = time.perf_counter() - t0
    cur, kept_from, known = 2, 1, {}
    stats: Counter[str] = Counter()
    leftovers: list[Path] = []

    for trial in range(TRIALS):
        before = path.read_bytes()
        lines = writers.start(config_file, first=cur + 1)
        pid = writers.pid
        aim = "early" if trial % 10 == 0 else rng.choice(["anywhere", "in a temp file"])
        if aim == "anywhere":  # a random point of the 1st or 2nd write
            lines += writers.read_until(f"begin {cur + 1 + rng.randrange(2)}")
            time.sleep(rng.uniform(0, write_s))
        elif aim == "in a temp file":  # just after the archive's or the results' temp file
            lines += writers.read_until(f"temp {rng.choice(['archive', 'results'])}")
            time.sleep(rng.uniform(0, 0.005))
        # "early": as soon as the writer is ready, before it writes
        lines += writers.kill()

        begun = max((int(w.split()[1]) for w in lines if w.startswith("begin ")), default=cur)
        done = max((int(w.split()[1]) for w in lines if w.startswith("done ")), default=cur)
        assert begun - done in (0, 1), lines
        # the results file: the previous complete run or the new complete one
        seq = current_seq(cfg)
        assert seq in (done, begun), (trial, seq, lines)
        if seq == cur:
            assert path.read_bytes() == before
        visible = sorted(p.name for p in cfg.results_dir.iterdir() if not p.name.startswith("."))
        assert visible == [FILE, "history"]
        # history: every run before the current one since the last pruning, none after it
        known = history_seqs(cfg, known)
        assert set(range(kept_from, seq)) <= set(known.values()), (trial, seq, known)
        assert max(known.values()) <= seq

        mine = temps_of(cfg, pid)
        leftovers += mine
        stats[f"aimed {aim}"] += 1
        if begun > done:
            stats["inside write_results, " + ("new" if seq == begun else "old") + " kept"] += 1
        stats["mid-write: temp file left"] += bool(mine)
        stats["mid-write: in the archive copy"] += any(p.parent.name == "history" for p in mine)
        stats["mid-write: in the results file"] += any(p.parent == cfg.results_dir for p in mine)

        for p in [p for p, s in known.items() if s < seq - 1]:  # bound the disk use
            p.unlink()
            del known[p]
        cur, kept_from = seq, seq - 1

    print(f"\n[durability] {TRIALS} kills: {dict(sorted(stats.items()))}; "
          f"one write of {BLOB_BYTES >> 20} MB took {write_s * 1000:.0f} ms")
    assert stats["mid-write: temp file left"] >= MIN_MID_WRITE, stats

    # leftovers from killed writers are fresh: kept, and harmless to readers and writers
    assert {p.parent for p in leftovers} == {cfg.results_dir, cfg.results_dir / "history"}
    assert all(p.exists() for p in leftovers)
    write(cfg, cur + 1)
    assert current_seq(cfg) == cur + 1
    assert cur in history_seqs(cfg, known).values()
    assert all(p.exists() for p in leftovers)
    # once old (their writers are dead), the next write removes them, in both directories
    backdate(leftovers)
    write(cfg, cur + 2)
    assert [p for p in leftovers if p.exists()] == []
    assert current_seq(cfg) == cur + 2
    assert {cur, cur + 1} <= set(history_seqs(cfg).values())


# point where the writer is killed -> (run left in the results file, history runs right
# after the kill, directory of the temp file it leaves, history runs after one more write)
STEPS = {
    "before-archive-replace": (2, [1], "history", [1, 2]),
    "after-archive-replace": (2, [1, 2], None, [1, 2, 2]),
    "before-results-replace": (2, [1, 2], "results", [1, 2, 2]),
    "after-results-replace": (3, [1, 2], None, [1, 2, 3]),
}


@pytest.mark.parametrize("point", list(STEPS))
def test_kill_at_each_step_of_a_write(test_cfg, config_file, writers, point):
    """Kill the writer at a fixed step of one write (held there by a handshake): what
    the results file, history/ and the temp files hold, then after more normal writes."""
    cfg = test_cfg
    survivor, history_after_kill, temp_dir, history_after_next = STEPS[point]
    path = cfg.results_dir / FILE
    write(cfg, 1)
    write(cfg, 2)
    old = path.read_bytes()

    writers.start(config_file, first=3, hold=point)
    pid = writers.pid
    writers.read_until(f"held {point}")
    writers.kill()

    # "after-archive-replace" is the window between archiving and writing: the current
    # file must still be there (archiving copies it), not moved away
    assert path.exists()
    assert current_seq(cfg) == survivor
    if survivor == 2:
        assert path.read_bytes() == old
    assert sorted(history_seqs(cfg).values()) == history_after_kill
    temps = temps_of(cfg, pid)
    where = {"history": cfg.results_dir / "history", "results": cfg.results_dir}
    assert [p.parent for p in temps] == ([where[temp_dir]] if temp_dir else [])

    # a later normal write succeeds; the fresh temp file stays and confuses nobody
    write(cfg, 4)
    assert current_seq(cfg) == 4
    assert sorted(history_seqs(cfg).values()) == history_after_next
    assert all(p.exists() for p in temps)
    # once it is old and its writer gone, the next write into its directory removes it
    backdate(temps)
    write(cfg, 5)
    assert [p for p in temps if p.exists()] == []
    assert current_seq(cfg) == 5


def test_stale_temp_rules(tmp_path, monkeypatch):
    """Only temp files of our naming, with a dead writer PID, old enough, are removed."""
    dead, alive = dead_pid(), os.getpid()
    names = {
        "dead_old": f".out.json.{dead}.abc_12xy.tmp",
        "dead_fresh": f".out.json.{dead}.k3j9z0qq.tmp",
        "alive_old": f".out.json.{alive}.abc_12xy.tmp",
        "pid0_old": ".out.json.0.abc_12xy.tmp",  # 0 would mean "my process group"
        "no_pid_old": ".out.json.abc_12xy.tmp",  # not our naming: leave alone
        "not_hidden_old": f"out.json.{dead}.abc_12xy.tmp",
        "dotted_name_old": f".report.2024.json.{dead}.abc_12xy.tmp",
    }
    for key, name in names.items():
        (tmp_path / name).write_text(key)
    (tmp_path / f".dir.{dead}.abc_12xy.tmp").mkdir()
    backdate([tmp_path / n for k, n in names.items() if k.endswith("_old")])
    backdate([tmp_path / f".dir.{dead}.abc_12xy.tmp"])

    removed = atomic.remove_stale_temps(tmp_path)
    assert sorted(p.name for p in removed) == sorted([names["dead_old"], names["dotted_name_old"]])
    left = {p.name for p in tmp_path.iterdir()}
    assert left == set(names.values()) - {names["dead_old"], names["dotted_name_old"]} | {
        f".dir.{dead}.abc_12xy.tmp"
    }
    # an atomic write into the directory runs the same cleanup
    stale = tmp_path / f".other.txt.{dead}.zz_99aa.tmp"
    stale.write_text("left by a killed writer")
    backdate([stale])
    atomic.atomic_write_text(tmp_path / "out.json", "{}")
    assert not stale.exists() and (tmp_path / "out.json").read_text() == "{}"
    assert (tmp_path / names["dead_fresh"]).exists() and (tmp_path / names["alive_old"]).exists()

    # the temp names atomic writes use carry the writer's PID, in the form cleanup parses
    published = []
    real_replace = os.replace

    def spy(src, dst):
        published.append(Path(src).name)
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", spy)
    atomic.atomic_write_text(tmp_path / "out.json", "[]")
    assert len(published) == 1
    assert re.fullmatch(rf"\.out\.json\.{os.getpid()}\.[a-z0-9_]+\.tmp", published[0])
    assert atomic._TEMP_NAME.match(published[0]).group(1) == str(os.getpid())
