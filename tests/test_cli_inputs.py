"""Bad command-line input ends in one line that says what is wrong, never a traceback or
a hang: arguments are checked as what they are (a notebook number, a size, a URL, a list
of numbers), files are read only when regular and small."""

from __future__ import annotations

import os
import sys

import pytest

from lab_utils import cli
from lab_utils.cli.args import notebook_number

BAD_ARGS = [
    (["status", "--config", ""], "--config is empty"),
    (["run", "--from", "../../etc"], "not a notebook number"),
    (["run", "--to", "3x"], "not a notebook number"),
    (["serve", "--topology", "baseline", "--dry-run", "--mem-total-gib", "nan"], "GiB"),
    (["serve", "--topology", "baseline", "--dry-run", "--mem-total-gib", "inf"], "GiB"),
    (["serve", "--topology", "baseline", "--dry-run", "--mem-total-gib", "1e300"], "GiB"),
    (["bench", "--url", "file:///etc/passwd", "--out", "x"], "base URL"),
    (["bench", "--url", "http://[::1", "--out", "x"], "base URL"),
    (["bench", "--url", "http://127.0.0.9:1", "--out", "x", "--concurrency", "1,x"],
     "positive numbers"),
    (["bench", "--url", "http://127.0.0.9:1", "--out", "x", "--rate", "0"], "positive numbers"),
    # bench's workload options are held to the config's own limits
    (["bench", "--url", "http://127.0.0.9:1", "--out", "x", "--num-prompts", "0"],
     "num_prompts: Input should be greater than 0"),
    (["bench", "--url", "http://127.0.0.9:1", "--out", "x", "--range-ratio", "1.5"],
     "range_ratio: Input should be less than 1"),
]


@pytest.mark.parametrize("argv,said", BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_bad_arguments_are_refused_in_one_line(argv, said, capsys):
    with pytest.raises(SystemExit) as stop:
        code = cli.main(argv)
        raise SystemExit(code)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err


def test_notebook_numbers_are_numbers():
    assert notebook_number("3") == "03" and notebook_number("05") == "05"


def test_a_fifo_config_is_refused_without_blocking(tmp_path, capsys):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    assert cli.main(["status", "--config", str(fifo)]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_a_down_server_is_named_not_a_traceback(tmp_path, capsys):
    """Nothing listens on 127.0.0.9:1 (loopback; the connection is refused at once)."""
    assert cli.main(["bench", "--url", "http://127.0.0.9:1", "--out", str(tmp_path / "b"),
                     "--concurrency", "1"]) == 2
    err = capsys.readouterr().err
    assert "did not answer" in err and "Traceback" not in err


def test_secret_files_are_read_only_when_regular_and_small(tmp_path):
    from lab_utils.util.atomic import read_bounded

    fifo, big = tmp_path / "key", tmp_path / "big"
    os.mkfifo(fifo)
    big.write_bytes(b"k" * 70_000)
    for path, why in ((fifo, "not a regular file"), (big, "over"), (tmp_path, "not a regular")):
        with pytest.raises(OSError, match=why):
            read_bounded(path, 64 * 1024)
    assert sys.getsizeof(read_bounded(big, 80_000)) > 70_000
