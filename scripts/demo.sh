#!/usr/bin/env bash
# The main job, on a fresh machine too: sets up .venv, builds the Hub variants,
# loads the kernel through kernels.get_kernel, runs and verifies the 16 public
# workloads, prints a table and writes results/demo.json and results/demo.png.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m rope_bwd_triton demo "$@"
