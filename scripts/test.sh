#!/usr/bin/env bash
# The tests, on a fresh machine too: sets up .venv, runs ruff's lint and format check, the
# whole suite (CPU tensors through the PyTorch path; CUDA tests when a GPU is present), then
# the package tests again with TRITON_INTERPRET=1, so that the Triton kernel itself runs in
# Triton's interpreter on CPU tensors (only the cases marked `interpret`: each kernel branch
# and layout once, on small shapes; tests/conftest.py; and every family of the installed
# transformers against its own function), then hub CI's test step in its own
# environment with the oldest and the newest kernels, the latter on the newest torch and its
# Triton, on the CPU and in the interpreter (scripts/hub-ci.sh), the tests that go through kernels
# and transformers on the oldest releases the README supports and on the newest (scripts/against.sh
# with requirements-oldest.txt, requirements-newest.txt), and the workflows' lint, these last four
# side by side, each one's output printed when it ends. Arguments go to
# the first two pytest runs. Every pytest run prints its skips by reason and fails on one outside
# tests/skips.py's short list.
# Each stage's wall time is printed at the end. The venvs of hub CI's twins (the newest torch's: a
# few GB of wheels to unpack, one process) are made in the background, niced, while setup.sh makes
# .venv on CI's other core and after it wherever a core idles; the last four stages wait for them.
set -euo pipefail
cd "$(dirname "$0")/.."
# Python's bytecode caches on, where the environment turns them off: each of the stages' dozens of
# processes would compile the package and the tests again (pytest's assertion rewriting, in
# each). __pycache__ is ignored by git and left out of the builds.
unset PYTHONDONTWRITEBYTECODE
times=()
stage() {  # stage NAME COMMAND...: run it, note its time
  local name=$1 start=$SECONDS
  shift
  echo "=== $name"
  "$@"
  times+=("$name: $((SECONDS - start)) s")
}
report() {
  printf '%s\n' "${times[@]}"
}
trap report EXIT
PY=.venv/bin/python
prepare_log=$(mktemp)
# niced: where both cores are busy with tests, the tests come first. They live under .venv: they
# start once setup.sh's venv has made it (both making it at once fails one of them: File exists).
(for _ in $(seq 600); do [ -x .venv/bin/python ] && break; sleep 1; done  # bounded: setup.sh may fail
  nice -n 19 bash scripts/hub-ci.sh --prepare requirements-oldest.txt requirements-newest.txt) > "$prepare_log" 2>&1 &
prepare_pid=$!
prepared() {  # wait for the venvs; where making them failed, the stages make them (and fail) themselves
  wait "$prepare_pid" || echo "making the venvs in the background failed (the stages retry):"
  cat "$prepare_log" && rm -f "$prepare_log"
}
stage setup bash scripts/setup.sh
stage ruff bash -c '.venv/bin/ruff check . && .venv/bin/ruff format --check .'  # configured in pyproject.toml
stage suite $PY -m pytest -q -n 2 --dist loadgroup "$@"  # loadgroup: tests/toolkit/test_bench.py
stage interpreter env TRITON_INTERPRET=1 $PY -m pytest -q -n 2 tests/test_*.py \
  tests/toolkit/test_families.py::test_kernelized_function_equals_the_familys \
  tests/toolkit/test_decoders.py::test_decoder_family "$@"
together() {  # together NAME FUNCTION ...: those stages at once, each one's output and time as it ends
  local start=$SECONDS out i rc=0 names=() pids=()
  out=$(mktemp -d)
  while [ $# -gt 0 ]; do
    names+=("$1")
    (s=$SECONDS && "$2" && echo "$1: $((SECONDS - s)) s" >> "$out/times") > "$out/${#names[@]}.log" 2>&1 &
    pids+=($!)
    shift 2
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || rc=$?
    echo "=== ${names[$i]}"
    cat "$out/$((i + 1)).log"
  done
  [ ! -f "$out/times" ] || mapfile -t -O "${#times[@]}" times < "$out/times"
  times+=("(${names[*]} side by side: $((SECONDS - start)) s)")
  rm -rf "$out"
  return "$rc"
}
hub_ci() { bash scripts/hub-ci.sh requirements-oldest.txt requirements-newest.txt; }
oldest() { bash scripts/against.sh requirements-oldest.txt; }
newest() { bash scripts/against.sh requirements-newest.txt; }
lint_workflows() { bash scripts/lint-workflows.sh; }
prepared
# hub CI's runs, one process each and of unequal lengths, leave a core idle part of the time: the
# oldest and newest releases' workers and the workflows' lint run beside them
together hub-ci hub_ci oldest oldest newest newest lint-workflows lint_workflows
