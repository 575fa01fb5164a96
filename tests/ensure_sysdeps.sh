#!/usr/bin/env bash
# Ensure the system packages the tests need are present: the OpenSSH server binary
# (/usr/sbin/sshd, package openssh-server) that tests/sshd_server.py runs privately on a
# loopback port, ssh-keygen (package openssh-client) that makes its keys, and a headless
# browser (`chromium`, package chromium) that the report test uses to check that
# report.html renders with every plot, and `ip` (package iproute2) that builds the
# simulated cluster's network namespaces (tests/simcluster.py), and `wrk` (package wrk),
# the HTTP load tool that python -m lab_utils.bench.proxy and its test drive, and
# `chromedriver` (package chromium-driver), through which the browser test drives
# JupyterLab. Idempotent: when all are present it does nothing.
# As root with apt-get it installs what is missing; otherwise it names the packages to
# install and exits 1. The tests never use a system sshd that the package may start on
# port 22; they always run their own.
set -euo pipefail

missing=()
[[ -x /usr/sbin/sshd ]] || missing+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 || missing+=(openssh-client)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)

if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi

if [[ ${EUID} -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_sysdeps: missing ${missing[*]} (sshd/ssh-keygen for the loopback SSH tests," \
        "chromium for the report rendering test);" \
        "please install: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi

echo "ensure_sysdeps: installing ${missing[*]} (private loopback sshd + ssh-keygen for the" \
    "SSH node tests, headless chromium for the report test)"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null

for bin in /usr/sbin/sshd ssh-keygen chromium ip wrk chromedriver; do
    if ! command -v "$bin" >/dev/null 2>&1; then
        echo "ensure_sysdeps: $bin still missing after installing ${missing[*]}" >&2
        exit 1
    fi
done
