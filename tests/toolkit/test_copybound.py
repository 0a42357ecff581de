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
    proc = subprocess.run(
        [sys.executable, "-m", "rope_bwd_triton", "copybound", "--quick", "--json", str(out)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = json.loads(out.read_text())
    assert run["meta"]["command"] == f"python -m rope_bwd_triton copybound --quick --json {out}"
    assert run["meta"]["gpu"] is None and run["meta"]["versions"]["torch"]
    configs = [tuple(c) for c in run["configs"]]
    (w,) = run["workloads"]  # a bench run: ours and the device copy of every task, each verified
    assert set(w["floors"]) == set(w["triton_copy"]) == TASKS
    assert set(w["results"]) == {f"{who}_{task}" for who in ("ours", "copy") for task in TASKS}
    for r in w["results"].values():
        assert r["verify"]["ok"] and r["time"]["n"] == 2 and r["time"]["mean_us"] > 0
    for task, (us, block, warps) in w["triton_copy"].items():
        assert us > 0 and (block, warps) in configs and w["floors"][task]["us"] > 0, task
    assert w["triton_copy"]["fwd"] == w["triton_copy"]["bwd_qk"]  # same floor bytes, timed once
    # one table line per task
    assert sum(line.split()[0] in TASKS for line in proc.stdout.splitlines() if line.strip()) == len(TASKS)
