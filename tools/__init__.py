"""Investigations that answered a question about the CPU rehearsal once, kept so that the
answer can be checked again; not part of the lab a user runs (that is `lab_utils`). Each
runs from the repository's root as a module and prints its figures:

- `pd_stall`: the rehearsal's disaggregated topology under one config change at a time, and
  the KV hold that once stood the machine still (`python -m tools.pd_stall`).
- `pd_compare`: the single instance, the replicated pair and P/D three ways, one after
  another (`python -m tools.pd_stall --compare`).
- `nixl_policies`: NIXL's progress threads as vLLM leaves them, lowered, and waiting
  (`python -m tools.nixl_policies`).
- `slow_clients`: clients that stop reading, against the proxy's time-outs
  (`python -m tools.slow_clients`).

What each found is written in docs/REHEARSAL.md and docs/PROXY.md.
"""
