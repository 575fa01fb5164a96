"""Progress bars in a notebook are one line of text redrawn in place: the saved notebook
keeps each bar's final line (a widget would be saved as its first state, "0% 0/14"), and
under the headless runner each bar also logs one line when it closes."""

from __future__ import annotations

import nbclient
import nbformat

CODE = """
from lab_utils.util.progress import progress_bar
import time
with progress_bar(total=14, desc="things", unit="it") as bar:
    for i in range(14):
        time.sleep(0.01)
        bar.update(1)
left = progress_bar(total=3, desc="left", leave=False)
left.update(2)
left.close()
"""


def test_a_saved_notebook_keeps_each_bars_final_line(tmp_path, monkeypatch):
    log = tmp_path / "progress.log"
    monkeypatch.setenv("LAB_PROGRESS_LOG", str(log))  # as the headless runner sets it
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(CODE)]
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=120).execute()
    shown = [o["data"]["text/plain"] for o in nb.cells[0].outputs if o["output_type"] == "display_data"]
    assert len(shown) == 2 and all("widget" not in str(o) for o in nb.cells[0].outputs)
    assert shown[0].startswith("things: 100%") and "14/14" in shown[0]
    assert shown[1].startswith("left:  67%") and "2/3" in shown[1]
    lines = log.read_text().splitlines()
    assert lines[0].startswith("things: 14/14 it in") and lines[1].startswith("left: 2/3 it in")


def test_a_bar_in_a_log_file_writes_one_line_per_step(tmp_path, monkeypatch):
    from lab_utils.util.progress import progress_bar

    monkeypatch.delenv("LAB_PROGRESS_LOG", raising=False)
    path = tmp_path / "serve.log"
    with (open(path, "w") as f,  # a file, not a terminal
          progress_bar(total=3, desc="waiting", unit="instance", file=f) as bar):
        for i in range(3):
            for s in range(5):  # refreshes of the same count, as the elapsed time moves
                bar.set_postfix_str(f"{i}.{s} s")
            bar.update(1)
    lines = path.read_text().splitlines()
    assert [ln.split("|")[0].split(":")[0] for ln in lines] == ["waiting"] * 4, lines
    assert "\r" not in path.read_text()
    assert ["0/3" in lines[0], "1/3" in lines[1], "2/3" in lines[2], "3/3" in lines[3]] == [True] * 4
