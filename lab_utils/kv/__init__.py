"""The KV cache: how big it is, and what moving it between nodes costs.

- `shapes`: KV bytes per token and per vLLM block from a model's config.json (GQA, MLA).
- `budget`: notebook 02's arithmetic (sizes per prompt length, predicted against measured
  transfer time, the `kv_buffer_device` to use).
- `probe`: the NIXL transfer probe's driver, run from the notebook. The agent it starts on
  each serving node is `lab_utils.on_node.nixl_agent`.

NIXL's API in a few lines (two agents, one READ), which notebook 02 shows and runs, is in
`lab_utils.notebook.hood`.
"""

from lab_utils.kv import budget
from lab_utils.kv.probe import run_probe
from lab_utils.kv.shapes import KVShape, kv_shape, kv_shape_from_dir

__all__ = ["KVShape", "budget", "kv_shape", "kv_shape_from_dir", "run_probe"]
