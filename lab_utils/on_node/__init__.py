"""Code that runs on the nodes, not in the notebook.

- `proctools`: process and port facts read from /proc, and stopping a process group.
- `facts`: what the checklist gathers on each node (versions, devices, addresses).

Both are sent as source over SSH before anything is deployed, so they import only the
standard library (a test checks it). They are also imported here, for local nodes.
"""
