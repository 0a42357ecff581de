"""ROPE_CUDA_ONLY=1 (tests/conftest.py), the GPU run's selection, checked on the CPU: collected
as on a GPU machine (torch made to report one), it keeps every test that may touch CUDA and
drops the CPU's parametrizations and the tests marked cpu_only."""

import json
import os
import re
import subprocess
import sys

import pytest

from rope_bwd_triton import REPO_ROOT

# A plugin loaded before the tests import torch's answer (tests/helpers.py: DEVICES): one GPU of
# 80 GiB, as far as collection asks; it records what the run kept and what it dropped.
FAKE_GPU = """
import json, os, types
import torch

torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(total_memory=80 * 2**30)
seen = {"kept": [], "dropped": []}


def pytest_deselected(items):
    seen["dropped"] += [item.nodeid for item in items]


def pytest_collection_finish(session):
    seen["kept"] = [item.nodeid for item in session.items]
    with open(os.environ["SEEN"], "w") as f:
        json.dump(seen, f)
"""
FILES = ["tests/test_ops.py", "tests/toolkit/test_tuning.py", "tests/toolkit/test_transformers_flows.py"]


def on_cpu(nodeid) -> bool:
    """A parametrization whose id names the CPU."""
    return re.search(r"[\[-]cpu[\]-]", nodeid) is not None


@pytest.mark.cpu_only  # a collection with a GPU faked
def test_the_gpu_run_keeps_what_may_touch_cuda(tmp_path):
    (tmp_path / "fake_gpu.py").write_text(FAKE_GPU)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ROPE_SHARD")}
    env |= {"ROPE_CUDA_ONLY": "1", "SEEN": str(tmp_path / "seen.json")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "fake_gpu", "-p", "no:cacheprovider", *FILES]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    kept, dropped = set(seen["kept"]), set(seen["dropped"])
    assert kept and not kept & dropped
    assert not [n for n in kept if on_cpu(n)]
    assert {n for n in kept | dropped if "cuda" in n} <= kept  # every CUDA parametrization
    default_config = {n for n in dropped if "test_default_config_is_valid_and_fills_the_gpu" in n}
    assert len(default_config) == 3  # one per mode, marked cpu_only
    assert dropped == default_config | {n for n in dropped if on_cpu(n)}
    # tests without a device parameter that take CUDA's path where it is present stay
    assert "tests/test_ops.py::test_cuda_matches_cpu_path" in kept
    assert "tests/toolkit/test_tuning.py::test_tune_on_a_gpu_compiles_the_grid_in_worker_processes_first" in kept
