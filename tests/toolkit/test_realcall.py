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
