"""The end-to-end command on a tiny encoder: exercises the code path (CPU numbers mean
nothing), loading the kernel the way a user does, offline from a Hub cache."""

import json
import os
import subprocess
import sys

from rope_bwd_triton import REPO_ROOT, publish


def test_e2e_quick(tmp_path):
    publish.install_build(tmp_path / "cache")
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_KERNELS", "TRITON_INTERPRET")}
    env.update(HF_HUB_OFFLINE="1", KERNELS_CACHE=str(tmp_path / "cache"), HF_HUB_CACHE=str(tmp_path / "hub"))
    proc = subprocess.run(
        [sys.executable, "-m", "rope_bwd_triton", "e2e", "--quick", "--out", str(tmp_path / "out")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "out" / "e2e.json").read_text())
    (row,) = report["results_ms"].values()
    assert set(row) == {"eager", "kernelized", "identity"} and all(v > 0 for v in row.values())
    md = (tmp_path / "out" / "e2e.md").read_text()
    assert "| tokens | eager rotary | kernelized (rope-bwd) | identity rotary (bound) |" in md
