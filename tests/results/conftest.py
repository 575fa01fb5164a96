"""The profile the tests of `lab_utils.results` write under (tmp_path)."""

from __future__ import annotations

import pytest

from lab_utils.config import parse_config

from support.results_files import config_dict


@pytest.fixture
def cfg(tmp_path):
    return parse_config(config_dict(tmp_path / "results"))
