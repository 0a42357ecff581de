#!/usr/bin/env bash
# Idempotent set-up of the project's virtual environment (.venv), shared by the
# demo and the tests. Reinstalls only when requirements-dev.txt changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
want=$(sha256sum requirements-dev.txt | cut -d' ' -f1)
if [ "$(cat .venv/.requirements.sha 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
  echo "$want" > .venv/.requirements.sha
fi
