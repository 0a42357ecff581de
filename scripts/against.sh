#!/usr/bin/env bash
# The package against the newest kernels and transformers (requirements-newest.txt): those
# releases installed without dependencies into .venv/newest and laid over .venv (the pinned
# set serves their dependencies), then the tests that go through kernels and transformers:
# the layers, every family of that transformers, saved models, training parity. Arguments go
# to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
site=.venv/newest
want=$(sha256sum requirements-newest.txt | cut -d' ' -f1)
if [ "$(cat "$site/.requirements.sha" 2>/dev/null)" != "$want" ]; then
  rm -rf "$site"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --target "$site" -r requirements-newest.txt
  echo "$want" > "$site/.requirements.sha"
fi
export PYTHONPATH=$site
.venv/bin/python - <<'PY'
import importlib.metadata as md
import pathlib
import re

pins = re.findall(r"^(\w+)==(\S+)", pathlib.Path("requirements-newest.txt").read_text(), re.M)
got = {name: md.version(name) for name, _ in pins}
assert got == dict(pins), f"not laid over .venv: {got}"
print("newest:", ", ".join(f"{n} {v}" for n, v in got.items()))
PY
.venv/bin/python -m pytest -q -p no:cacheprovider tests/test_kernelize.py tests/toolkit/test_families.py \
  tests/toolkit/test_kernelize_transformers.py tests/toolkit/test_pickle.py tests/toolkit/test_e2e.py "$@"
