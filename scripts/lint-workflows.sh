#!/usr/bin/env bash
# The workflows (which only GitHub runs) checked here: against the GitHub workflow schema
# (check-jsonschema's bundled copy) and by zizmor's static audits (pedantic persona), both
# offline, from a throwaway venv. tests/toolkit/test_hub_ci.py checks what they run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
"$PY" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile check-jsonschema==0.39.0 zizmor==1.32.0
"$venv/bin/check-jsonschema" --builtin-schema vendor.github-workflows .github/workflows/*.yaml
"$venv/bin/zizmor" --offline --persona pedantic .github/workflows
