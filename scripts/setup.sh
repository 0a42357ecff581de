#!/usr/bin/env bash
# Idempotent set-up of the project's virtual environment (.venv), shared by the
# demo and the tests. Reinstalls only when requirements-dev.txt changes. --no-compile: the
# bytecode of the modules every run imports is written once by importing them, the rest's when a
# run first imports it, rather than by pip's pass over every module of every package (most of
# torch's and transformers' modules no run imports).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
want=$(sha256sum requirements-dev.txt | cut -d' ' -f1)
if [ "$(cat .venv/.requirements.sha 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile -r requirements-dev.txt
  env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c "import torch._dynamo, transformers, kernels, triton, matplotlib.pyplot"
  echo "$want" > .venv/.requirements.sha
fi
