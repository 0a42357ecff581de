#!/usr/bin/env bash
# The tests, on a fresh machine too: sets up .venv, runs the whole suite (CPU
# tensors through the PyTorch path; CUDA tests when a GPU is present), then the
# kernel-correctness files again with TRITON_INTERPRET=1, so that the Triton
# kernels themselves run in Triton's interpreter on CPU tensors; then hub CI's test
# step in its own environment (scripts/hub-ci.sh) and the workflows' lint. Ruff's lint and
# format check come first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=.venv/bin/python
.venv/bin/ruff check . && .venv/bin/ruff format --check .  # lint and format (pyproject.toml)
$PY -m pytest -q "$@"
TRITON_INTERPRET=1 $PY -m pytest -q tests/test_ops.py tests/test_special_values.py tests/test_bad_input.py \
    tests/test_specialization.py tests/test_autograd_transforms.py tests/test_dtypes.py "$@"
bash scripts/hub-ci.sh
bash scripts/lint-workflows.sh
