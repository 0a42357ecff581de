"""`python -m rope_bwd_triton copybound` end to end on the CPU: ours and the Triton copies run in
Triton's interpreter (a subprocess with TRITON_INTERPRET=1), every copy is checked against its
source and ours against float64 inside the command; the timings mean nothing there."""

import json
import os
import subprocess
import sys

from rope_bwd_triton import REPO_ROOT

TASKS = {"bwd", "bwd_qk", "bwd_bf16", "fwd", "fwd_bf16"}


def test_quick_run_writes_every_task(tmp_path):
    out = tmp_path / "copy_bound.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "rope_bwd_triton", "copybound", "--quick", "--json", str(out)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = json.loads(out.read_text())
    assert run["meta"]["command"] == f"python -m rope_bwd_triton copybound --quick --json {out}"
    assert run["meta"]["gpu"] is None and run["meta"]["versions"]["torch"]
    configs = [tuple(c) for c in run["configs"]]
    (row,) = run["workloads"]
    for key in ("floor_us", "ours_us", "device_copy_us", "triton_copy"):
        assert set(row[key]) == TASKS, key
    for task, (us, block, warps) in row["triton_copy"].items():
        assert us > 0 and (block, warps) in configs, task
    assert row["triton_copy"]["fwd"] == row["triton_copy"]["bwd_qk"]  # same floor bytes, timed once
    assert all(v > 0 for key in ("floor_us", "ours_us", "device_copy_us") for v in row[key].values())
    # one table line per task
    assert sum(line.split()[0] in TASKS for line in proc.stdout.splitlines() if line.strip()) == len(TASKS)
