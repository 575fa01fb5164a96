"""Test helpers: a private sshd, the simulated cluster, recorded nodes, fakes, leak scans."""
