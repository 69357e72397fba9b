#!/usr/bin/env bash
# Runs a command with tools/fakecuda standing in for the driver, e.g.
#   tools/fakecuda/run.sh python -m pytest -m gpu tests/test_graph_gpu.py
# CuPy and torch are shadowed (their runtimes need the real driver). See tools/fakecuda/README.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=$("$here/build.sh")
export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$here/shadow${PYTHONPATH:+:$PYTHONPATH}"
exec "$@"
