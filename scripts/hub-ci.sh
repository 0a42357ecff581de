#!/usr/bin/env bash
# Hub CI's test step (`nix run .#ci-test` of kernel-builder), reproduced without Nix:
# `pytest tests -m kernels_ci` over a copy of only what kernel-builder's source set
# holds (build.toml, and the build.toml `pyext` files of torch-ext/ and tests/), in a
# fresh venv with only torch, pytest and numpy (pins from requirements-dev.txt) and kernels,
# PYTHONPATH at the variant and LOCAL_KERNELS at the built variants, from a neutral
# directory; once per environment file given (default: requirements-oldest.txt and
# requirements-newest.txt), with that file's kernels. Fails unless at least MIN_TESTS tests ran
# and all passed in each.
set -euo pipefail
cd "$(dirname "$0")/.."
MIN_TESTS=20
envs=("$@")
[ ${#envs[@]} -gt 0 ] || envs=(requirements-oldest.txt requirements-newest.txt)
bash scripts/setup.sh  # the toolkit, which builds the variants as kernel-builder lays them out
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

exts=$(.venv/bin/python -c 'import tomllib; print(*tomllib.load(open("build.toml", "rb"))["torch-noarch"]["pyext"])')
mkdir "$work/src"
cp build.toml "$work/src/"
for ext in $exts; do
  find torch-ext tests -type f -name "*.$ext" -not -path '*/__pycache__/*' -exec cp --parents {} "$work/src/" \;
done
.venv/bin/python -m rope_bwd_triton build --out "$work/kernel" >/dev/null
repo_id=$(.venv/bin/python -c 'from rope_bwd_triton.build import repo_id; print(repo_id())')

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
"$PY" -m venv "$work/venv"
grep -E '^(torch|pytest|numpy)(==|$)' requirements-dev.txt > "$work/requirements.txt"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check -r "$work/requirements.txt"

variant=torch-$("$work/venv/bin/python" -c 'import torch; print("cuda" if torch.version.cuda else "cpu")')
for env_file in "${envs[@]}"; do
  kernels_pin=$(grep -E '^kernels==' "$env_file")
  "$work/venv/bin/python" -m pip install -q --disable-pip-version-check "$kernels_pin"
  start=$SECONDS
  rc=0
  (cd "$work" && env -u TRITON_INTERPRET -u LD_LIBRARY_PATH PYTHONPATH="$work/kernel/$variant" \
    LOCAL_KERNELS="$repo_id=$work/kernel" "$work/venv/bin/python" -m pytest "$work/src/tests" -m kernels_ci \
    -p no:cacheprovider -q --junitxml="$work/junit.xml") || rc=$?
  echo "hub CI twin, $kernels_pin: pytest exit $rc in $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || exit "$rc"
  "$work/venv/bin/python" - "$work/junit.xml" "$MIN_TESTS" "$kernels_pin" <<'PY'
import sys
import xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot().find("testsuite")
ran = int(suite.get("tests")) - int(suite.get("skipped"))
print(f"hub CI twin, {sys.argv[3]}: {ran} kernels_ci tests ran")
sys.exit(0 if ran >= int(sys.argv[2]) else f"hub CI twin: fewer than {sys.argv[2]} kernels_ci tests ran")
PY
done
