"""spark-disagg-lab: the package behind the notebooks.

Notebooks stay thin and call into these modules: `config` (the profile), `nodes` (acting
on machines), `launcher` and `topology` (vLLM instances), `pd` (prefill/decode by hand and
the proof that KV moved), `metrics`, `results`, `tiny_model`, `kv` and the CLI
(`python -m lab_utils`).
"""

from lab_utils.config import LabConfig, load_config

__all__ = ["LabConfig", "load_config"]
