#!/usr/bin/env bash
# The package against the releases of one environment file (requirements-oldest.txt: the oldest
# the README supports; requirements-newest.txt: what a fresh `pip install` gives).
# Its kernels and transformers pins: installed without dependencies into .venv/<file's name> and
# laid over .venv (the pinned set serves their dependencies), then the tests that go through
# kernels and transformers: the private parts of them internals.py names, the layers, every family
# of that transformers, the routes to the package, saved models, training parity, the flows through
# transformers' own kernel management (Trainer, train()/eval(), KernelConfig). (The kernels_ci
# tests, which need no transformers, run with each file's kernels in scripts/hub-ci.sh.)
# Its torch and triton pins, where torch is not .venv's: a venv of their own in
# .venv/<file's name>-torch (made once, again when those pins change; .venv's site-packages
# after its own serves the rest), and the package tests (tests/test_*.py) on it: hub CI's subset
# on the CPU, then that subset's interpret-marked cases in Triton's interpreter. Further
# arguments go to pytest.
# With --prepare first, it only makes that torch venv (it needs no .venv: scripts/test.sh makes it
# while setup.sh makes .venv, on CI's other core).
#   bash scripts/against.sh requirements-oldest.txt
#   bash scripts/against.sh --prepare requirements-newest.txt
set -euo pipefail
cd "$(dirname "$0")/.."
prepare=
[ "${1:-}" != --prepare ] || { prepare=1; shift; }
env_file=${1:?usage: scripts/against.sh [--prepare] <requirements file with kernels and transformers pins> [pytest args]}
shift
[ -n "$prepare" ] || bash scripts/setup.sh
has_pins() {  # whether .venv's python (with PYTHONPATH) sees the file's kernels and transformers pins
  .venv/bin/python - "$env_file" <<'PY'
import importlib.metadata as md
import pathlib
import re
import sys

pins = dict(re.findall(r"^(kernels|transformers)==(\S+)", pathlib.Path(sys.argv[1]).read_text(), re.M))
got = {name: md.version(name) for name in pins}
print(f"{sys.argv[1]}:", ", ".join(f"{n} {v}" for n, v in got.items()), "" if got == pins else f"(wants {pins})")
sys.exit(got != pins)
PY
}
mapfile -t torch_pins < <(grep -E '^(torch|triton)==' "$env_file" || true)
venv=.venv/$(basename "$env_file" .txt)-torch
torch_venv() {  # make $venv with the file's torch and triton (once, again when those pins change)
  local want
  want=$(printf '%s\n' "${torch_pins[@]}" | sha256sum | cut -d' ' -f1)
  [ "$(cat "$venv/.requirements.sha" 2>/dev/null)" != "$want" ] || return 0
  rm -rf "$venv"
  local py=${PYTHON:-python3.11}
  command -v "$py" >/dev/null || py=python3
  "$py" -m venv "$venv"
  # with their dependencies: the torch wheel of this index is a CUDA build, which loads CUDA's
  # libraries even on a machine without a GPU
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${torch_pins[@]}"
  echo "$want" > "$venv/.requirements.sha"
}
if [ -n "$prepare" ]; then
  # where .venv's torch is the file's, newer_torch makes no venv (.venv has none yet to ask)
  want_torch=$(grep -oP '^torch==\K\S+' "$env_file" || true)
  [ -z "$want_torch" ] || [ "$want_torch" = "$(grep -oP '^torch==\K\S+' requirements-dev.txt)" ] || torch_venv
  exit 0
fi
newer_torch() {  # the file's torch and triton in a venv of their own, where torch is not .venv's
  local want_torch
  want_torch=$(grep -oP '^torch==\K\S+' "$env_file" || true)
  [ -n "$want_torch" ] || return 0
  if [ "$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))')" = "$want_torch" ]; then
    echo "$env_file: .venv has torch $want_torch; the suite and interpreter stages ran the package tests on it"
    return 0
  fi
  torch_venv
  # after its own site-packages, .venv's, for kernels, pytest and the rest (torch and triton
  # are its own); relative, as the venv lies inside .venv wherever that is
  "$venv/bin/python" -c 'import os, sys, sysconfig; p = sysconfig.get_path("purelib")
open(os.path.join(p, "dot-venv.pth"), "w").write(os.path.relpath(sys.argv[1], p) + "\n")' \
    "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
  "$venv/bin/python" - "$env_file" <<'PY'
import importlib.metadata as md
import pathlib
import re
import sys

pins = dict(re.findall(r"^(torch|triton)==(\S+)", pathlib.Path(sys.argv[1]).read_text(), re.M))
got = {name: md.version(name).split("+")[0] for name in pins}
print(f"{sys.argv[1]}:", ", ".join(f"{n} {md.version(n)}" for n in pins), "" if got == pins else f"(wants {pins})")
sys.exit(got != pins)
PY
  # hub CI's subset on the CPU, then its interpret-marked cases in this Triton's interpreter (the
  # ops, dtypes, special values, transforms and checks; the interpreter stage runs them all on
  # .venv's Triton): the whole package suite twice over takes longer than CI's budget allows
  "$venv/bin/python" -m pytest -q -n 2 -p no:cacheprovider tests/test_*.py -m kernels_ci "$@"
  TRITON_INTERPRET=1 "$venv/bin/python" -m pytest -q -n 2 -p no:cacheprovider tests/test_*.py -m kernels_ci "$@"
}
# The tests run offline (tests/offline.py fails a test that tried the network). transformers 5.24
# asks the Hub for a flash-attention 4 kernel when it imports some families (falcon among them)
# and ignores the failure; in offline mode huggingface_hub refuses before connecting.
export HF_HUB_OFFLINE=1
# Pins that .venv already has (requirements-dev.txt pins the newest releases today): the suite
# stage ran these tests on them, so they are not run twice.
if has_pins >/dev/null; then
  echo "$env_file: .venv has these kernels and transformers; the suite stage ran the tests on them"
  newer_torch "$@"
  exit 0
fi
site=.venv/$(basename "$env_file" .txt)
want=$(sha256sum "$env_file" | cut -d' ' -f1)
if [ "$(cat "$site/.requirements.sha" 2>/dev/null)" != "$want" ]; then
  rm -rf "$site"
  grep -vE '^(torch|triton)==' "$env_file" > "$site.txt.tmp"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --target "$site" -r "$site.txt.tmp"
  rm -f "$site.txt.tmp"
  echo "$want" > "$site/.requirements.sha"
fi
export PYTHONPATH=$site
has_pins  # laid over .venv
.venv/bin/python -m pytest -q -n 2 -p no:cacheprovider tests/test_internals.py tests/test_kernelize.py tests/toolkit/test_families.py \
  tests/toolkit/test_kernelize_transformers.py tests/toolkit/test_pickle.py \
  tests/toolkit/test_decoders.py tests/test_decoder.py tests/toolkit/test_transformers_flows.py tests/toolkit/test_routes.py "$@"
newer_torch "$@"
