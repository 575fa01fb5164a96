"""Code that runs on the nodes, not in the notebook.

- `proctools`: process and port facts read from /proc, and stopping a process group.
- `facts`: what the checklist gathers on each node (versions, devices, addresses).
- `dirs`: which directories the lab may replace or write into (only its own).
- `nixl_threads`: NIXL's busy progress threads in an instance's process group, found by
  what they do, and the lowest normal priority for them (`kv_transfer.lower_nixl_threads`).
- `nixl_agent`: one side of the NIXL transfer probe (`python -m lab_utils.on_node.nixl_agent`),
  started by `lab_utils.kv.probe` on each serving node from the deployed copy of the lab;
  it needs numpy, nixl and torch there.
- `api_guard`: the ASGI middleware that makes a vLLM instance with a key want it on every
  route but /health and /metrics (loaded by vLLM from the deployed copy).

`proctools`, `facts`, `dirs` and `nixl_threads` are sent as source over SSH before anything is deployed, so they
import only the standard library; nothing here imports lab_utils outside this folder
(tests/test_layout.py checks both). They are imported here too, for local nodes.
"""
