#!/usr/bin/env bash
# The package against the kernels and transformers releases of one environment file
# (requirements-oldest.txt: the oldest the README supports; requirements-newest.txt: what a
# fresh `pip install` gives): those releases installed without dependencies into
# .venv/<file's name> and laid over .venv (the pinned set serves their dependencies), then the
# package's kernels_ci tests (what hub CI runs on the built variant) and the tests that go through
# kernels and transformers: the layers, every family of that transformers, saved models, training
# parity. Further arguments go to both pytest runs.
#   bash scripts/against.sh requirements-oldest.txt
set -euo pipefail
cd "$(dirname "$0")/.."
env_file=${1:?usage: scripts/against.sh <requirements file with kernels and transformers pins> [pytest args]}
shift
bash scripts/setup.sh
site=.venv/$(basename "$env_file" .txt)
want=$(sha256sum "$env_file" | cut -d' ' -f1)
if [ "$(cat "$site/.requirements.sha" 2>/dev/null)" != "$want" ]; then
  rm -rf "$site"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --target "$site" -r "$env_file"
  echo "$want" > "$site/.requirements.sha"
fi
export PYTHONPATH=$site
.venv/bin/python - "$env_file" <<'PY'
import importlib.metadata as md
import pathlib
import re
import sys

pins = re.findall(r"^(\w+)==(\S+)", pathlib.Path(sys.argv[1]).read_text(), re.M)
got = {name: md.version(name) for name, _ in pins}
assert got == dict(pins), f"not laid over .venv: {got}"
print(f"{sys.argv[1]}:", ", ".join(f"{n} {v}" for n, v in got.items()))
PY
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)
# the package's kernels_ci tests, as hub CI collects them (its copy of tests/ has no toolkit)
"${pytest[@]}" tests -m kernels_ci --ignore=tests/toolkit "$@"
"${pytest[@]}" tests/test_kernelize.py tests/toolkit/test_families.py tests/toolkit/test_kernelize_transformers.py \
  tests/toolkit/test_pickle.py tests/toolkit/test_e2e.py "$@"
