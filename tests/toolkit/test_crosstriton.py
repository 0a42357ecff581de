"""`python -m rope_bwd_triton crosstriton`: compile runs on any machine (the installed Triton
compiles for sm_90a); run checks every cubin and this machine's own launch against float64
before timing them, so its reference must be right: here it is checked against the package's
own path on CPU tensors. The GPU test runs the whole command on cubins of the installed Triton."""

import json

import pytest
import torch

from rope_bwd_triton import __main__ as toolkit
from rope_bwd_triton import crosstriton, suite
from rope_bwd_triton.load import submodule

from ..helpers import HAS_CUDA, INTERPRET

needs_compiler = pytest.mark.skipif(INTERPRET, reason="compiles the JIT kernel, which the interpreter replaces")


@needs_compiler
def test_compile_writes_a_cubin_per_case(kernel, tmp_path, capsys):
    import triton

    out = tmp_path / "cubins"
    assert toolkit.main(["crosstriton", "compile", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["triton"] == triton.__version__ and meta["gpu"] == "NVIDIA H200"
    assert [tuple(m["case"]) for m in meta["cases"]] == list(crosstriton.CASES)
    tuning = submodule(kernel, "tuning")
    for m in meta["cases"]:
        task, D, S, dtype, layout = m["case"]
        mode = {"real_fwd": "fwd", "real_bwd": "bwd_qk"}.get(task, task)
        elem = getattr(torch, dtype).itemsize
        assert m["config"] == tuning.gpu_config("NVIDIA H200", 132, mode, tuning.s_bucket(S), 16, 16, D, elem, layout)
        assert m["num_warps"] == m["config"]["num_warps"] and m["name"] == "rotary_kernel"
        assert (out / f"{crosstriton.tag(m['case'])}.cubin").read_bytes()[:4] == b"\x7fELF"
    # the sdpa layout's own tuned entry, not the contiguous one's
    (sdpa,) = [m for m in meta["cases"] if m["case"] == ["real_bwd", 72, 4096, "bfloat16", "sdpa"]]
    (flash,) = [m for m in meta["cases"] if m["case"] == ["real_bwd", 72, 4096, "bfloat16", "flash"]]
    assert sdpa["config"] != flash["config"]
    assert capsys.readouterr().out.startswith(f"15 cubins compiled by Triton {triton.__version__} for sm_90a")


def _package_results(kernel, case, ts):
    """What the package's own path (CPU tensors: PyTorch) gives for a case's outputs."""
    task = case[0]
    x_q, x_k, _, _, p_q, p_k, t0, t1, _, _ = ts
    if task == "real_fwd":
        return kernel.apply_rotary_pos_emb_vision(x_q, x_k, t0, t1)
    if task == "real_bwd":
        leaves = [torch.randn_like(x_q).requires_grad_(), torch.randn_like(x_k).requires_grad_()]
        return torch.autograd.grad(kernel.apply_rotary_pos_emb_vision(*leaves, t0, t1), leaves, (x_q, x_k))
    if task == "fwd":
        return kernel.rope_fwd(x_q, x_k, t0)
    if task == "bwd":
        return kernel.rope_bwd(x_q, x_k, p_q, p_k, t0)
    return kernel.rope_bwd(x_q, x_k, x_q, x_k, t0)[:2]


@pytest.mark.parametrize("case", sorted({c[:1] + (c[1], 7) + c[3:] for c in crosstriton.CASES}), ids=str)
def test_reference_is_the_math(kernel, case, gen):
    """run's float64 reference against the package on CPU tensors, each case at S = 7."""
    ts, adjoint, outs = crosstriton.tensors(case, torch.device("cpu"), gen)
    assert adjoint == (case[0] in ("real_bwd", "bwd", "bwd_qk"))
    assert all(ts[i].isnan().all() for i in outs)  # poisoned outputs
    ref = crosstriton.reference(case, ts)
    got = _package_results(kernel, case, ts)
    assert len(ref) == len(got) == len(outs)
    for r, g, i in zip(ref, got, outs):
        assert r.shape == ts[i].shape
        assert suite.rel_err(g, r) <= suite.TOLERANCE[case[3]], case


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_run_on_the_gpu(kernel, tmp_path, capsys):
    """The whole command on cubins of this machine's Triton: every case verified and timed."""
    out, result = tmp_path / "cubins", tmp_path / "crosstriton.json"
    assert toolkit.main(["crosstriton", "compile", "--out", str(out)]) == 0
    argv = ["crosstriton", "run", str(out), "--calls", "2", "--rounds", "1", "--json", str(result)]
    assert toolkit.main(argv) == 0
    run = json.loads(result.read_text())
    assert run["meta"]["this_triton"] == run["meta"]["other_triton"]
    assert len(run["rows"]) == len(crosstriton.CASES)
    for row in run["rows"]:
        assert set(row["us"]) == set(row["rel_err"]) == {"this", "other"}
        assert all(us > 0 for us in row["us"].values())
        assert all(e <= suite.TOLERANCE[row["case"][3]] for e in row["rel_err"].values())
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {result}"
