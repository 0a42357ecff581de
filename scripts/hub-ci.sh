#!/usr/bin/env bash
# Hub CI's test step (`nix run .#ci-test` of kernel-builder), reproduced without Nix:
# `pytest tests -m kernels_ci` over a copy of only what kernel-builder's source set
# holds (build.toml, and the build.toml `pyext` files of torch-ext/ and tests/), in a
# venv of its own with only torch, pytest and numpy (pins from requirements-dev.txt; made once,
# in .venv/hub-ci, and again when those pins change) and kernels,
# PYTHONPATH at the variant and LOCAL_KERNELS at the built variants, from a neutral
# directory; once per environment file given (default: requirements-oldest.txt and
# requirements-newest.txt), with that file's kernels (installed into a folder of its own,
# laid on PYTHONPATH), the files' runs side by side: each is one process, CI has two cores.
# Fails unless at least MIN_TESTS tests ran and all passed in each.
# With --prepare first, it only makes the venv and the kernels folders (it needs no .venv:
# scripts/test.sh makes them while setup.sh makes .venv, on CI's other core).
set -euo pipefail
cd "$(dirname "$0")/.."
MIN_TESTS=20
prepare=
[ "${1:-}" != --prepare ] || { prepare=1; shift; }
envs=("$@")
[ ${#envs[@]} -gt 0 ] || envs=(requirements-oldest.txt requirements-newest.txt)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
venv=.venv/hub-ci
grep -E '^(torch|pytest|numpy)(==|$)' requirements-dev.txt > "$work/requirements.txt"
want=$(sha256sum "$work/requirements.txt" | cut -d' ' -f1)
if [ "$(cat "$venv/.requirements.sha" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$work/requirements.txt"
  echo "$want" > "$venv/.requirements.sha"
fi
venv=$(cd "$venv" && pwd)  # the runs start in $work
kernels_site() {  # kernels_site ENV_FILE: that file's kernels in a folder of its own, $venv/<file's name>
  local site kernels_pin
  site=$venv/$(basename "$1" .txt)
  kernels_pin=$(grep -E '^kernels==' "$1")
  if [ "$(cat "$site/.pin" 2>/dev/null)" != "$kernels_pin" ]; then
    rm -rf "$site"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --target "$site" "$kernels_pin"
    echo "$kernels_pin" > "$site/.pin"
  fi
}
for env_file in "${envs[@]}"; do
  kernels_site "$env_file"
done
[ -z "$prepare" ] || exit 0

bash scripts/setup.sh  # the toolkit, which builds the variants as kernel-builder lays them out
exts=$(.venv/bin/python -c 'import tomllib; print(*tomllib.load(open("build.toml", "rb"))["torch-noarch"]["pyext"])')
mkdir "$work/src"
cp build.toml "$work/src/"
for ext in $exts; do
  find torch-ext tests -type f -name "*.$ext" -not -path '*/__pycache__/*' -exec cp --parents {} "$work/src/" \;
done
.venv/bin/python -m rope_bwd_triton build --out "$work/kernel" >/dev/null
repo_id=$(.venv/bin/python -c 'from rope_bwd_triton.build import repo_id; print(repo_id())')

variant=torch-$("$venv/bin/python" -c 'import torch; print("cuda" if torch.version.cuda else "cpu")')
run() {  # run ENV_FILE: the kernels_ci tests with that file's kernels; its output in $work/<file>.log
  local env_file=$1 name
  name=$(basename "$env_file" .txt)
  local kernels_pin
  kernels_pin=$(grep -E '^kernels==' "$env_file")
  local site=$venv/$name
  local start=$SECONDS rc=0
  (cd "$work" && env -u TRITON_INTERPRET -u LD_LIBRARY_PATH PYTHONPATH="$work/kernel/$variant:$site" \
    LOCAL_KERNELS="$repo_id=$work/kernel" "$venv/bin/python" -m pytest "$work/src/tests" -m kernels_ci \
    -p no:cacheprovider -q --junitxml="$work/$name.xml") || rc=$?
  echo "hub CI twin, $kernels_pin: pytest exit $rc in $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || return "$rc"
  "$venv/bin/python" - "$work/$name.xml" "$MIN_TESTS" "$kernels_pin" <<'PY'
import sys
import xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot().find("testsuite")
ran = int(suite.get("tests")) - int(suite.get("skipped"))
print(f"hub CI twin, {sys.argv[3]}: {ran} kernels_ci tests ran")
sys.exit(0 if ran >= int(sys.argv[2]) else f"hub CI twin: fewer than {sys.argv[2]} kernels_ci tests ran")
PY
}
pids=()
for env_file in "${envs[@]}"; do
  run "$env_file" > "$work/$(basename "$env_file" .txt).log" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!envs[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  cat "$work/$(basename "${envs[$i]}" .txt).log"
  [ "$rc" -eq 0 ] || failed=$rc
done
exit "$failed"
