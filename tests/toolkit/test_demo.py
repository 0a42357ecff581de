"""The main job end to end on this machine (tiny workloads): it loads the kernel through
get_kernel, verifies every token row of every workload against float64 and writes its JSON
(a bench run of ours' full backward) and plot."""

import json
import subprocess
import sys

import pytest

from rope_bwd_triton import REPO_ROOT, bench, demo, suite


def test_demo_runs_and_verifies(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rope_bwd_triton",
            "demo",
            "--seq-lens",
            "3",
            "17",
            "--calls",
            "2",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "through kernels.get_kernel" in proc.stdout and "all workloads pass" in proc.stdout
    run = json.loads((tmp_path / "demo.json").read_text())
    assert [w["S"] for w in run["workloads"]] == [3, 17]
    assert run["meta"]["calls"] == 2 and run["meta"]["command"].startswith("python -m rope_bwd_triton demo ")
    for w in run["workloads"]:
        assert list(w["results"]) == ["ours_bwd"]
        r = w["results"]["ours_bwd"]
        assert r["verify"]["ok"] and r["verify"]["max_rel_err"] < suite.TOLERANCE["float32"]
        assert r["verify"]["sol_pass_fraction"] == 1.0
        assert r["verify"]["rows"] == w["S"]  # every token row
        assert r["time"]["n"] == 2
    assert (tmp_path / "demo.png").stat().st_size > 0
    assert bench.render_markdown([run])  # `bench --from-json` renders it


def test_demo_table_on_a_gpu():
    """The GPU layout of the demo's table (floor, x floor, GB/s) from a known case: the
    public S=4096 workload moves 205.5 MB, 49.9 us at 4.12 TB/s; a 61.0 us call is 1.22x."""
    from rope_bwd_triton.timing import bandwidth_GBps, time_us

    nbytes = suite.floor_bytes(4096)
    assert nbytes == 4 * (6 * 4096 * 16 * 128 + 2 * 4096 * 128)
    floor = time_us(nbytes, 4120.0)
    assert floor == pytest.approx(49.884, abs=0.001)
    row = {
        "S": 4096,
        "rel_err": 7e-8,
        "sol_pass": 1.0,
        "ok": True,
        "time_us": 61.0,
        "floor_us": floor,
        "GBps": bandwidth_GBps(nbytes, 61.0),
    }
    lines = demo.table([row], "NVIDIA H200", 4120.0)
    assert lines[2].split() == ["4096", "7.00e-08", "100.0%", "61.0", "49.9", "1.22", "3369"]
    assert "floor 49.9 us (1.22x; copy bandwidth 4120 GB/s)" in lines[3]
    assert lines[4].startswith("verification: all workloads pass")
    row["ok"] = False
    assert demo.table([row], "NVIDIA H200", 4120.0)[2].endswith("FAILED")


def test_demo_verdict_takes_both_rules():
    """A workload passes within the tolerance and with SOL-ExecBench's rule met on >= 99% of
    its elements; ours failing to run fails the demo."""

    def run(rel_err, sol_pass):
        check = {"ok": rel_err <= suite.TOLERANCE["float32"], "max_rel_err": rel_err, "sol_pass_fraction": sol_pass}
        result = {"verify": check, "time": {"mean_us": 3.0}, "GBps": 5.0}
        return {
            "meta": {"gpu": "G"},
            "workloads": [{"S": 8, "floors": {"bwd": {"us": 2.0}}, "results": {"ours_bwd": result}}],
        }

    assert demo.rows(run(1e-7, 1.0)) == [
        {"S": 8, "rel_err": 1e-7, "sol_pass": 1.0, "ok": True, "time_us": 3.0, "floor_us": 2.0, "GBps": 5.0}
    ]
    assert not demo.rows(run(1e-7, 0.98))[0]["ok"]
    assert not demo.rows(run(2e-5, 1.0))[0]["ok"]
    broken = run(1e-7, 1.0)
    broken["workloads"][0]["results"]["ours_bwd"] = {"error": "RuntimeError: boom"}
    with pytest.raises(RuntimeError, match="S=8: RuntimeError: boom"):
        demo.rows(broken)
