"""The real call's benchmark and the first-call measurement, on the CPU: the code paths (the
numbers mean nothing there). The real call runs through the interpreter's Triton kernel when
TRITON_INTERPRET=1 is set, else the PyTorch path; either way it is verified against float64."""

import json
import subprocess
import sys

from rope_bwd_triton import REPO_ROOT, realcall


def test_realcall_quick_verifies_ours_and_an_ab_build(tmp_path):
    out = tmp_path / "rc"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rope_bwd_triton",
            "realcall",
            "--quick",
            "--peers",
            "copy,transformers",
            "--dtypes",
            "bfloat16",
            "float16",
            "--ab",
            str(REPO_ROOT),
            "--json",
            str(out / "rc.json"),
            "--markdown",
            str(out / "rc.md"),
            "--plot",
            str(out / "rc.png"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = json.loads((out / "rc.json").read_text())
    assert {(w["dtype"], w["layout"], w["S"]) for w in run["workloads"]} == {
        (dt, lay, S) for dt in ("bfloat16", "float16") for lay in realcall.LAYOUTS for S in (8, 33)
    }
    for w in run["workloads"]:
        assert set(w["results"]) == {"ours", "ab", "transformers", "copy"}
        assert all(r["verify"]["ok"] for r in w["results"].values())
    assert (out / "rc.png").stat().st_size > 0 and "ours / copy" in (out / "rc.md").read_text()


def test_sdpa_layout_is_the_transposed_gradient():
    import torch

    x = realcall.make_inputs(5, 2, 8, torch.bfloat16, "sdpa", "cpu", torch.Generator().manual_seed(0))
    assert x["gq"].shape == (5, 2, 8) and x["gq"].stride() == (8, 40, 1)
    assert x["q"].stride() == (48, 8, 1) and x["q"].requires_grad and not x["cos"].requires_grad


def test_coldstart_needs_a_gpu():
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the message on a machine without CUDA")
    proc = subprocess.run(
        [sys.executable, "-m", "rope_bwd_triton", "coldstart"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_coldstart_rotates_the_order_and_reports_medians_over_rounds():
    """Each round runs every implementation once, the first place taken in turn (no
    implementation always runs first); a row gives the median over rounds and the range."""
    from rope_bwd_triton import coldstart

    assert coldstart.rounds(["a", "b", "c"], 3) == [
        (0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a"), (2, "c"), (2, "a"), (2, "b"),
    ]  # fmt: skip

    def run(impl, first_ms, load_s, new_ms, again_ms, compiles=None):
        calls = [{"S": 9, "ms": first_ms, "new": True, "compiles": compiles and [["k", 0.1]] * compiles}]
        calls += [{"S": 10 + i, "ms": ms, "new": True, "compiles": compiles and []} for i, ms in enumerate(new_ms)]
        calls.append({"S": 10, "ms": again_ms, "new": False, "compiles": compiles and []})
        return {"impl": impl, "load_s": load_s, "calls": calls}

    runs = [
        run("ours", 1600.0, 4.0, [0.6, 4.4], 1.0, compiles=2),
        run("ours", 530.0, 5.0, [0.8], 0.9, compiles=2),
        run("ours", 560.0, 4.5, [0.7, 0.65], 1.1, compiles=2),
        run("liger", 1900.0, 11.0, [1.5], 1.9),
        {"impl": "liger", "error": "RuntimeError: no GPU"},
        run("liger", 520.0, 8.0, [1.7, 185.0], 1.7),
    ]
    meta = {"heads": 16, "head_dim": 72, "rounds": 3, "gpu": "G", "date": "D", "sizes": [9, 10, 11]}
    meta["versions"] = {"torch": "t", "triton": "tr"}
    table = coldstart.markdown(runs, meta)
    ours = next(line for line in table.splitlines() if line.startswith("| ours"))
    liger = next(line for line in table.splitlines() if line.startswith("| liger"))
    assert [c.strip() for c in ours.split("|")[1:-1]] == [
        "ours", "4500 (4000-5000)", "560 (530-1600)", "0.7 (0.6-4.4)", "1.00 (0.90-1.10)", "2 then 0", "",
    ]  # fmt: skip
    assert [c.strip() for c in liger.split("|")[1:-1]] == [
        "liger", "9500 (8000-11000)", "1210 (520-1900)", "1.7 (1.5-185.0)", "1.80 (1.70-1.90)", "—",
        "1 of 3 runs failed: RuntimeError: no GPU",
    ]  # fmt: skip
    assert "3 round(s) in rotated order" in table
