"""Code that runs on the nodes, not where the notebook runs.

`proctools` and `facts` are standard library only: their source is sent to a node's
Python over SSH, so they work before the lab is deployed there. `nixl_agent` (the NIXL
probe's agent) runs from the deployed copy and needs numpy and nixl (torch for VRAM).
Nothing here imports another lab_utils package.
"""
