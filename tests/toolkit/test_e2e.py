"""The end-to-end command on a tiny encoder: exercises the code path (CPU numbers mean
nothing), loading the kernel the way a user does, offline from a Hub cache."""

import gzip
import json
import os
import subprocess
import sys

import torch

from rope_bwd_triton import REPO_ROOT, e2e, publish

from ..helpers import COMPILE_BACKEND

VARIANTS = ("eager", "kernelized", "identity")


def _quick_e2e(tmp_path, *flags, result="e2e.json"):
    """`e2e --quick` in a fresh process, the kernel loaded offline from a Hub cache:
    (its environment, output folder, the result JSON)."""
    publish.install_build(tmp_path / "cache")  # both branches; get_kernel reads v1
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_KERNELS", "TRITON_INTERPRET")}
    env.update(HF_HUB_OFFLINE="1", KERNELS_CACHE=str(tmp_path / "cache"), HF_HUB_CACHE=str(tmp_path / "hub"))
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "rope_bwd_triton", "e2e", "--quick", *flags, "--out", str(out)]
    proc = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return env, out, json.loads((out / result).read_text())


def test_e2e_quick(tmp_path):
    env, out, report = _quick_e2e(tmp_path, "--profile")
    assert report["meta"]["rounds"] * report["meta"]["steps_per_round"] == report["meta"]["iters"]
    ((n, row),) = report["results_ms"].items()
    assert set(row) == set(VARIANTS) and all(v > 0 for v in row.values())
    for v in VARIANTS:
        host = report["host_ms"][n][v]
        assert 0 < host["enqueue"] <= host["wall"]
        rounds = report["round_medians_ms"][n][v]
        assert len(rounds) == report["meta"]["rounds"] and all(r > 0 for r in rounds)
        assert min(rounds) <= row[v] <= max(rounds)

    profile = report["profile"][n]
    for v in VARIANTS:
        p = profile[v]
        assert p["kernel_ms"] > 0 and p["launches"] > 0
        assert 0 <= p["rotary_ms"] <= p["kernel_ms"] and 0 <= p["rotary_launches"] <= p["launches"]
        table = (out / p["table"]).read_text()
        assert p["table"] == f"profile-{n}-{v}.txt" and "Name" in table and "aten::" in table
        trace = json.loads(gzip.decompress((out / p["trace"]).read_bytes()))
        assert trace["traceEvents"]
    # Only the kernelized step runs an operator named rotary; the identity rotary runs less than eager.
    assert profile["kernelized"]["rotary_launches"] > 0 and profile["kernelized"]["rotary_ms"] > 0
    assert profile["eager"]["rotary_launches"] == profile["identity"]["rotary_launches"] == 0
    assert profile["identity"]["launches"] < profile["eager"]["launches"]

    md = (out / "e2e.md").read_text()
    assert "| tokens | eager rotary | kernelized (rope-bwd) | identity rotary (bound) | kernelized vs bound " in md
    assert "| tokens | variant | step | host enqueue | host wall | rounds | kernel time | idle | kernels |" in md
    assert sum(line.startswith(f"| {n} | ") for line in md.splitlines()) == 1 + len(VARIANTS)
    # The saved JSON renders the same tables again.
    again = subprocess.run(
        [sys.executable, "-m", "rope_bwd_triton", "e2e", "--from-json", str(out / "e2e.json")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and again.stdout.strip() == md.strip(), again.stderr


def test_e2e_quick_compiled(tmp_path):
    """--compile: every variant compiled in its warm-up, and the timed rounds switch between the
    variants' graphs without compiling again (dynamo guards on the rotary global); on CUDA only
    the kernelized graphs launch our kernel. On CPU aot_eager (tests/helpers.py's COMPILE_BACKEND):
    the traced graphs hold our ops' math (rotary_torch), so no event names it."""
    backend = COMPILE_BACKEND["cuda" if torch.cuda.is_available() else "cpu"]
    _, out, report = _quick_e2e(tmp_path, "--compile", backend, "--profile")
    assert report["meta"]["compile"] == backend
    ((n, row),) = report["results_ms"].items()
    assert set(row) == set(VARIANTS) and all(v > 0 for v in row.values())
    frames = report["compiled_frames"][n]
    assert frames["warm-up"] > 0 and frames["timed"] == 0
    profile = report["profile"][n]
    assert (profile["kernelized"]["rotary_launches"] > 0) == (report["meta"]["gpu"] is not None)
    assert profile["eager"]["rotary_launches"] == profile["identity"]["rotary_launches"] == 0
    md = (out / "e2e.md").read_text()
    assert (
        "every variant torch.compile'd" in md and f"{n} tokens {frames['warm-up']} in the warm-up, 0 while timed" in md
    )


def test_paired_vs_bound():
    """Round by round: drift that hits both variants of a round cancels."""
    report = {
        "round_medians_ms": {4096: {"kernelized": [10.2, 21.0, 10.5, 31.0], "identity": [10.0, 20.0, 10.0, 30.0]}}
    }
    median, within, rounds = e2e.paired_vs_bound(report, 4096)
    assert rounds == 4 and within == 1  # +2%, +5%, +5%, +3.3%: only the first is within 3%
    assert abs(median - (0.05 + 1 / 30) / 2) < 1e-12


def test_markdown_of_a_run_recorded_before_run_meta():
    """`e2e --from-json` renders the saved runs RESULTS.md cites: their meta holds the GPU's name in
    "device" and the versions flat."""
    report = e2e.summarize({4096: {v: {"steps": [(2.0, 1.0, 2.5)] * 2} for v in VARIANTS}}, rounds=2)
    fields = dict(dtype="bfloat16", warmup=1, iters=2, rounds=2, steps_per_round=1, model="m", compile=False)
    versions = {"torch": "2.11", "triton": "3.6", "transformers": "4.57"}
    old = e2e.markdown(report, {"device": "NVIDIA H200", **versions, **fields})
    new = e2e.markdown(report, {"device": "cuda", "gpu": "NVIDIA H200", "versions": versions, **fields})
    assert old == new
    assert "(fwd+bwd), NVIDIA H200, bfloat16" in new and "(CUDA events)" in new
    assert "(torch 2.11, triton 3.6, transformers 4.57)" in new
    cpu = e2e.markdown(report, {"device": "cpu", "gpu": None, "versions": versions, **fields})
    assert "(fwd+bwd), CPU, bfloat16" in cpu and "(wall clock)" in cpu


def test_rounds_interleave_and_rotate(monkeypatch):
    """All variants warmed up before any timing; each round times every variant in turn,
    starting one later each round."""
    calls, installed = [], []
    monkeypatch.setattr(e2e, "timed_step", lambda model, *inputs: calls.append(model) or (1.0, 0.5, 1.0))
    steps = e2e.time_variants({"a": "A", "b": "B", "c": "C"}, installed.append, (), warmup=1, rounds=3, per_round=2)
    assert "".join(calls) == "ABC" + "AABBCC" + "BBCCAA" + "CCAABB"
    assert "".join(installed) == "abc" + "abc" + "bca" + "cab"
    assert {k: len(v) for k, v in steps.items()} == {"a": 6, "b": 6, "c": 6}
    report = e2e.summarize({7: {k: {"steps": v} for k, v in steps.items()}}, rounds=3)
    assert report["round_medians_ms"][7]["a"] == [1.0, 1.0, 1.0] and "profile" not in report


def test_varres_quick(tmp_path):
    """`e2e --varres --quick`: each variant in its own fresh process, two passes over images of
    varying size, on the CPU (a code-path check). One of the encoders it trains: the path is the
    same for each (test_families builds each one's tiny encoder and checks its rotary)."""
    family = "qwen2_5_vl"
    flags = ("--varres", "--varres-sides", "4", "6", "--variants", "eager,kernelized", "--family", family)
    _, out, report = _quick_e2e(tmp_path, *flags, result="e2e-varres.json")
    assert report["meta"]["family"] == family
    assert [r["variant"] for r in report["runs"]] == ["eager", "kernelized"]
    for r in report["runs"]:
        assert r["tokens"] == [16, 36] and len(r["passes"]) == 2
        assert all(len(p) == 2 and all(ms > 0 for ms in p) for p in r["passes"])
    assert "| kernelized |" in (out / "e2e-varres.md").read_text()


def test_e2e_quick_decoder(tmp_path):
    """--decoder: a tiny Llama decoder's training step, the three variants and their tables; only
    the kernelized one runs an operator named rotary."""
    _, out, report = _quick_e2e(tmp_path, "--decoder", "--batch", "2", "--profile", result="e2e-decoder.json")
    meta = report["meta"]
    assert meta["target"] == "Llama decoder (2 layers, batch 2)" and "hidden_size 64" in meta["model"]
    ((n, row),) = report["results_ms"].items()
    assert n == "64" and set(row) == set(VARIANTS) and all(v > 0 for v in row.values())
    profile = report["profile"][n]
    assert profile["kernelized"]["rotary_launches"] > 0 and profile["kernelized"]["rotary_ms"] > 0
    assert profile["eager"]["rotary_launches"] == profile["identity"]["rotary_launches"] == 0
    assert profile["identity"]["launches"] < profile["eager"]["launches"]
    md = (out / "e2e-decoder.md").read_text()
    assert md.startswith("Llama decoder (2 layers, batch 2) training step") and ".tolist()" not in md
    assert sum(line.startswith(f"| {n} | ") for line in md.splitlines()) == 1 + len(VARIANTS)
