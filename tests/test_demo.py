"""The main job end to end on this machine (tiny workloads): it loads the kernel through
get_kernel, verifies every workload against float64 and writes its JSON and plot."""

import json
import subprocess
import sys

import pytest

from rope_bwd_triton import REPO_ROOT


@pytest.mark.kernels_ci
def test_demo_runs_and_verifies(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "rope_bwd_triton", "demo", "--seq-lens", "3", "17", "--calls", "2", "--out", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "through kernels.get_kernel" in proc.stdout and "all workloads pass" in proc.stdout
    result = json.loads((tmp_path / "demo.json").read_text())
    assert [r["S"] for r in result["rows"]] == [3, 17]
    for row in result["rows"]:
        assert row["ok"] and row["rel_err"] < 1e-5 and row["sol_pass"] == 1.0
    assert (tmp_path / "demo.png").stat().st_size > 0
