#!/usr/bin/env bash
# The package against the releases of one environment file (requirements-oldest.txt: the oldest
# the README supports; requirements-newest.txt: what a fresh `pip install` gives).
# Its kernels and transformers pins: installed without dependencies into .venv/<file's name> and
# laid over .venv (the pinned set serves their dependencies), then the tests that go through
# kernels and transformers: the private parts of them internals.py names, the layers, every family
# of that transformers, the routes to the package, saved models, training parity, the flows through
# transformers' own kernel management (Trainer, train()/eval(), KernelConfig). (The kernels_ci
# tests, which need no transformers, run with each file's kernels, and its torch where it pins one,
# in scripts/hub-ci.sh.) Further arguments go to pytest.
#   bash scripts/against.sh requirements-oldest.txt
set -euo pipefail
cd "$(dirname "$0")/.."
env_file=${1:?usage: scripts/against.sh <requirements file with kernels and transformers pins> [pytest args]}
shift
bash scripts/setup.sh
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
# The tests run offline (tests/offline.py fails a test that tried the network). transformers 5.24
# asks the Hub for a flash-attention 4 kernel when it imports some families (falcon among them)
# and ignores the failure; in offline mode huggingface_hub refuses before connecting.
export HF_HUB_OFFLINE=1
# Pins that .venv already has (requirements-dev.txt pins the newest releases today): the suite
# stage ran these tests on them, so they are not run twice.
if has_pins >/dev/null; then
  echo "$env_file: .venv has these kernels and transformers; the suite stage ran the tests on them"
  exit 0
fi
site=.venv/$(basename "$env_file" .txt)
want=$(sha256sum "$env_file" | cut -d' ' -f1)
if [ "$(cat "$site/.requirements.sha" 2>/dev/null)" != "$want" ]; then
  rm -rf "$site"
  grep -vE '^(torch|triton)==' "$env_file" > "$site.txt.tmp"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-compile --no-deps --target "$site" -r "$site.txt.tmp"
  rm -f "$site.txt.tmp"
  echo "$want" > "$site/.requirements.sha"
fi
export PYTHONPATH=$site
has_pins  # laid over .venv
.venv/bin/python -m pytest -q -n 2 -p no:cacheprovider tests/test_internals.py tests/test_kernelize.py tests/toolkit/test_families.py \
  tests/toolkit/test_kernelize_transformers.py tests/toolkit/test_pickle.py \
  tests/toolkit/test_decoders.py tests/toolkit/test_transformers_flows.py tests/toolkit/test_routes.py "$@"
