"""The lab replaces only directories it made, and writes only into a workdir of its own
(`lab_utils.on_node.dirs`); the tiny model generator follows the same rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lab_utils.cluster import tiny_model
from lab_utils.errors import LabError
from lab_utils.on_node import dirs

MARKER = "lab.marker"


def test_owner_tells_the_labs_directories_from_anyone_elses(tmp_path):
    assert dirs.owner(str(tmp_path / "none"), MARKER) == "absent"
    (tmp_path / "empty").mkdir()
    assert dirs.owner(str(tmp_path / "empty"), MARKER) == "empty"
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / MARKER).write_text("")
    (tmp_path / "ours" / "weights").write_text("w")
    assert dirs.owner(str(tmp_path / "ours"), MARKER) == "lab"
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "weights").write_text("w")
    assert dirs.owner(str(tmp_path / "theirs"), MARKER) == "other"
    (tmp_path / "file").write_text("x")
    assert dirs.owner(str(tmp_path / "file"), MARKER) == "other"
    (tmp_path / "link").symlink_to(tmp_path / "ours")
    assert dirs.owner(str(tmp_path / "link"), MARKER) == "other"


def test_replace_leaves_anyone_elses_directory_alone(tmp_path):
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / MARKER).write_text("new")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "weights").write_text("theirs")
    assert dirs.replace(str(staging), str(theirs), MARKER) == "other"
    assert (theirs / "weights").read_text() == "theirs" and staging.is_dir()
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / MARKER).write_text("old")
    (ours / "stale").write_text("x")
    assert dirs.replace(str(staging), str(ours), MARKER) == "lab"
    assert sorted(p.name for p in ours.iterdir()) == [MARKER] and not staging.exists()
    assert dirs.remove(str(theirs), MARKER) == "other" and theirs.is_dir()


def test_workdir_must_be_a_directory_of_the_labs_own(tmp_path, monkeypatch):
    home = tmp_path / "home" / "lab"
    (home / "spark-disagg-lab" / ".venv").mkdir(parents=True)  # docs/CLUSTER.md's layout
    monkeypatch.setenv("HOME", str(home))
    assert dirs.workdir_problem(str(home / "spark-disagg-lab")) is None
    assert dirs.workdir_problem(str(tmp_path / "elsewhere" / "lab")) is None
    assert "home directory" in dirs.workdir_problem(str(home))
    assert "home directory" in dirs.workdir_problem(f"{home}/")
    assert "home directory" in dirs.workdir_problem(str(home / "spark-disagg-lab" / ".."))
    assert "holds the home directory" in dirs.workdir_problem(str(home.parent))
    assert "holds the home directory" in dirs.workdir_problem("/")
    (tmp_path / "to-home").symlink_to(home)
    assert "home directory" in dirs.workdir_problem(str(tmp_path / "to-home"))
    for top in ("/opt", "/srv", "/data"):
        assert dirs.workdir_problem(top) == "it is a top-level directory", top
    for system in ("/usr/local/lab", "/etc/lab", "/var/../usr/lib"):
        assert dirs.workdir_problem(system) == "it is a system directory", system


def test_tiny_model_never_replaces_a_directory_it_did_not_make(tmp_path):
    theirs = tmp_path / "models" / "llama"
    theirs.mkdir(parents=True)
    (theirs / "config.json").write_text("{}")
    (theirs / "model.safetensors").write_bytes(b"their weights")
    with pytest.raises(LabError) as e:
        tiny_model.generate(theirs)
    assert str(theirs) in str(e.value) and tiny_model.MARKER in str(e.value)
    assert "Choose another directory" in str(e.value) and "remove that one yourself" in str(e.value)
    assert (theirs / "model.safetensors").read_bytes() == b"their weights"
    assert sorted(os.listdir(theirs)) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in theirs.parent.iterdir()) == [".llama.lock", "llama"]


def test_every_removal_in_the_package_goes_through_the_ownership_rule():
    """No `rm -rf` or rmtree outside `dirs` (and the private temp dirs, which only
    `Node.private_tmp` makes, by name)."""
    package = Path(dirs.__file__).parents[1]
    found = {p.relative_to(package).as_posix() for p in package.rglob("*.py")
             if "rmtree" in p.read_text() or "rm\", \"-rf" in p.read_text()
             or "rm -rf" in p.read_text()}
    assert found == {"on_node/dirs.py", "cluster/nodes.py"}
