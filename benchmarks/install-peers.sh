#!/usr/bin/env bash
# Installs the peers `python -m benchmarks.router --peers` measures d3-router against (issue 15.4), both optional
# and never installed by the test suite or CI:
#   - nginx (Debian's package): the floor of a proxy hop. Only the binary is used: the benchmark starts its own
#     nginx with a generated config in a temporary folder; the package's own service is stopped and disabled.
#   - LiteLLM proxy (`litellm[proxy]`) in a venv of its own, .venv-peers/ beside this repository's files: its pins
#     would fight the project's, so it never goes into .venv.
# Idempotent: a second run only checks. Usage: bash benchmarks/install-peers.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
LITELLM=${LITELLM:-'litellm[proxy]'}
# pip warns once per package about index folders this machine does not have; keep the log readable.
quiet() { "$@" 2>&1 | { grep -v -e 'is ignored: it is neither a file nor a directory' || true; }; }

if [ ! -x /usr/sbin/nginx ]; then
    if [ "$(id -u)" = 0 ]; then apt_get=(apt-get); else apt_get=(sudo apt-get); fi
    "${apt_get[@]}" update -qq
    DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" install -y -qq nginx >/dev/null
    # The benchmark runs nginx itself, on a free port: the package's service (port 80) has no part in it.
    if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ]; then systemctl disable --now nginx || true; else sudo systemctl disable --now nginx || true; fi
    elif [ -f /run/nginx.pid ]; then
        /usr/sbin/nginx -s stop 2>/dev/null || true
    fi
fi
/usr/sbin/nginx -v

if [ ! -x .venv-peers/bin/litellm ]; then
    "$PYTHON" -m venv .venv-peers
    quiet .venv-peers/bin/python -m pip install --quiet --upgrade pip
    quiet .venv-peers/bin/python -m pip install --quiet "$LITELLM"
fi
.venv-peers/bin/python -c 'import importlib.metadata as m; print("peers: litellm", m.version("litellm"), "in .venv-peers")'
