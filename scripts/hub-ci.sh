#!/usr/bin/env bash
# Hub CI's test step (`nix run .#ci-test` of kernel-builder), reproduced without Nix:
# `pytest tests -m kernels_ci` over a copy of only what kernel-builder's source set
# holds (build.toml, and the build.toml `pyext` files of torch-ext/ and tests/), in a
# venv with only torch, pytest and numpy, PYTHONPATH at the variant and LOCAL_KERNELS at the built
# variants, from a neutral directory; once per environment file given (default:
# requirements-oldest.txt and requirements-newest.txt), with that file's kernels (installed into a
# folder of its own, laid on PYTHONPATH). The venv's torch: requirements-dev.txt's pin
# (.venv/hub-ci), or the file's own torch and triton pins where it has them (.venv/hub-ci-<file's
# name>: the newest torch that installs here), on which the interpret-marked kernels_ci cases also
# run in Triton's interpreter. On requirements-dev's torch the tests of torch.compile on our ops
# are left to the suite stage (run()). Each venv is made once, and again when its pins change. The
# runs go side by side, each one process (CI has two cores).
# Fails unless at least MIN_TESTS tests ran and all passed in each run.
# With --prepare first, it only makes the venvs and the kernels folders (it needs no .venv:
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
twin_has_torch() {  # twin_has_torch ENV_FILE: whether the file pins a torch of its own
  grep -qE '^torch==' "$1"
}
twin_venv() {  # twin_venv ENV_FILE: the path of the venv for that file's runs
  if twin_has_torch "$1"; then echo ".venv/hub-ci-$(basename "$1" .txt)"; else echo .venv/hub-ci; fi
}
make_venv() {  # make_venv ENV_FILE: its venv with torch (and triton where pinned), pytest and numpy
  local venv want
  venv=$(twin_venv "$1")
  if twin_has_torch "$1"; then
    grep -E '^(torch|triton)==' "$1" > "$work/$(basename "$1")"
  else
    grep -E '^torch(==|$)' requirements-dev.txt > "$work/$(basename "$1")"
  fi
  grep -E '^(pytest|numpy)(==|$)' requirements-dev.txt >> "$work/$(basename "$1")"
  want=$(sha256sum "$work/$(basename "$1")" | cut -d' ' -f1)
  [ "$(cat "$venv/.requirements.sha" 2>/dev/null)" != "$want" ] || return 0
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  # a torch pin of its own: this index's newer torch is the CUDA build, with CUDA's libraries
  # (about 5 GB installed), which loads them even on a machine without a GPU
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile -r "$work/$(basename "$1")"
  # the bytecode of what every run imports, once (--no-compile: scripts/setup.sh says why)
  env -u PYTHONDONTWRITEBYTECODE "$venv/bin/python" -c "import torch._dynamo, pytest, numpy"
  echo "$want" > "$venv/.requirements.sha"
}
kernels_site() {  # kernels_site ENV_FILE: that file's kernels in a folder of its own, in its venv
  local site kernels_pin venv
  venv=$(twin_venv "$1")
  site=$venv/$(basename "$1" .txt)
  kernels_pin=$(grep -E '^kernels==' "$1")
  if [ "$(cat "$site/.pin" 2>/dev/null)" != "$kernels_pin" ]; then
    rm -rf "$site"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile --target "$site" "$kernels_pin"
    env -u PYTHONDONTWRITEBYTECODE PYTHONPATH="$site" "$venv/bin/python" -c "import kernels"
    echo "$kernels_pin" > "$site/.pin"
  fi
}
for env_file in "${envs[@]}"; do
  make_venv "$env_file"
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

junit_ran() {  # junit_ran XML WHAT: fails unless at least MIN_TESTS tests ran in that run
  "$2" - "$1" "$MIN_TESTS" "$3" <<'PY'
import sys
import xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot().find("testsuite")
ran = int(suite.get("tests")) - int(suite.get("skipped"))
print(f"hub CI twin, {sys.argv[3]}: {ran} kernels_ci tests ran")
sys.exit(0 if ran >= int(sys.argv[2]) else f"hub CI twin: fewer than {sys.argv[2]} kernels_ci tests ran")
PY
}
run() {  # run ENV_FILE PASS (cpu or interpreter): the kernels_ci tests with that file's kernels
  local env_file=$1 pass=$2 name venv py variant what start=$SECONDS rc=0 interpret=() same_torch=()
  name=$(basename "$env_file" .txt)
  venv=$(cd "$(twin_venv "$env_file")" && pwd)  # the runs start in $work
  py=$venv/bin/python
  read -r variant version < <("$py" -c 'import torch; print("torch-" + ("cuda" if torch.version.cuda else "cpu"), torch.__version__)')
  what="$(grep -E '^kernels==' "$env_file"), torch $version, $pass"
  [ "$pass" = cpu ] || interpret=(TRITON_INTERPRET=1)
  # On requirements-dev's torch the tests of torch.compile on our ops are the suite stage's, on
  # that same torch: kernels plays no part in them once the kernel fixture has loaded the
  # package. A file with a torch of its own runs them all.
  twin_has_torch "$env_file" || same_torch=(--ignore="$work/src/tests/test_compile.py" --ignore="$work/src/tests/test_out_compile.py")
  (cd "$work" && env -u TRITON_INTERPRET -u LD_LIBRARY_PATH "${interpret[@]}" \
    PYTHONPATH="$work/kernel/$variant:$venv/$name" LOCAL_KERNELS="$repo_id=$work/kernel" \
    "$py" -m pytest "$work/src/tests" -m kernels_ci "${same_torch[@]}" -p no:cacheprovider -q --junitxml="$work/$name-$pass.xml") || rc=$?
  echo "hub CI twin, $what: pytest exit $rc in $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || return "$rc"
  junit_ran "$work/$name-$pass.xml" "$py" "$what"
}
# every run its own process, side by side: a file with a torch of its own runs in the interpreter too
runs=()
for env_file in "${envs[@]}"; do
  runs+=("$env_file cpu")
  ! twin_has_torch "$env_file" || runs+=("$env_file interpreter")
done
pids=()
for i in "${!runs[@]}"; do
  # shellcheck disable=SC2086  # file and pass
  run ${runs[$i]} > "$work/run-$i.log" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!runs[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  cat "$work/run-$i.log"
  [ "$rc" -eq 0 ] || failed=$rc
done
exit "$failed"
