#!/usr/bin/env bash
# The main job, on a fresh machine too: sets up .venv, builds the Hub variants, loads the
# kernel through kernels.get_kernel, verifies every token row of the 16 public workloads
# against float64 and times rope_bwd on them (the bench's suite preset, ours' full backward in
# fp32 and bf16 alone), prints a table and writes results/demo.json, demo.md and demo.png.
# Without a GPU it runs the package's CPU path and says so: the table and plot then show the
# verification and the figures recorded on the H200 (benchmarks/h200/bench.json), as recorded.
# Extra arguments go to bench.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m rope_bwd_triton bench --preset suite --set suite --tasks bwd,bwd_bf16 --peers "" \
  --json results/demo.json --markdown results/demo.md --plot results/demo.png "$@"
