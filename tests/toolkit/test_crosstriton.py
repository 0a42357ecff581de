"""`python -m rope_bwd_triton crosstriton`: compile runs on any machine (the installed Triton
compiles for sm_90a); run checks every cubin and this machine's own launch against float64
before timing them, so its reference must be right: here it is checked against the package's
own path on CPU tensors. The GPU test runs the whole command on cubins of the installed Triton."""

import json

import pytest
import torch

from rope_bwd_triton import __main__ as toolkit
from rope_bwd_triton import crosstriton, suite, tune
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
    # the sdpa layout's own tuned entry, for this Triton's versions
    (sdpa,) = [m for m in meta["cases"] if m["case"] == ["real_bwd", 72, 4096, "bfloat16", "sdpa"]]
    assert sdpa["config"] == tuning.tuned_table("NVIDIA H200")["bwd_qk-D72-R32-b2-S4096-sdpa"]
    assert meta["later_triton"] is tuning.later_triton() and meta["sms"] == 132
    assert capsys.readouterr().out.startswith(f"15 cubins compiled by Triton {triton.__version__} for sm_90a")


@pytest.fixture
def small_tune(monkeypatch):
    """--tune over one kind and two candidates (the whole grid takes minutes to compile)."""
    kind = ("real_bwd", 72, "bfloat16", "sdpa")
    few = [
        {"BLOCK_S": 1, "BLOCK_D": 64, "BLOCK_R": 32, "num_warps": 1},
        {"BLOCK_S": 4, "BLOCK_D": 64, "BLOCK_R": 8, "num_warps": 2},
    ]
    monkeypatch.setattr(crosstriton, "TUNE_KINDS", (kind,))
    monkeypatch.setattr(crosstriton, "tune_candidates", lambda D: list(few))
    return kind, few


def test_tune_candidates_keep_half_rows_whole():
    for D in (72, 80):
        cands = crosstriton.tune_candidates(D)
        assert cands and all(c["BLOCK_D"] == 64 and tune.candidate_ok(c) for c in cands)
        assert {c["BLOCK_D"] for c in tune.grid(D, 32)} > {64}  # the narrower blocks are left out


def test_shared_winner_is_best_over_all_sizes_not_per_size():
    """tune's score over every size: a wins the first size by a little, b the other two by more,
    so b is the one for all; each size counts relative to the current configuration's time."""
    sizes = [{"a": 1.0, "b": 1.05}, {"a": 2.4, "b": 2.0}, {"a": 5.0, "b": 4.5}]
    base = [1.0, 2.2, 5.0]
    assert crosstriton.shared_winner(["a", "b"], sizes, base) == "b"
    assert crosstriton.shared_winner(["a", "b"], sizes[:1], base[:1]) == "a"
    assert crosstriton.shared_winner(["a"], sizes, base) == "a"  # only candidates that passed the check
    assert tune.relative_time([2.0, 3.0], [1.0, 4.0]) == pytest.approx((2.0 + 0.75) / 2)


@needs_compiler
def test_compile_tune_writes_each_candidate_and_the_tables_config(kernel, tmp_path, capsys, small_tune):
    kind, few = small_tune
    out = tmp_path / "cubins"
    assert toolkit.main(["crosstriton", "compile", "--tune", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    tuning = submodule(kernel, "tuning")
    assert [b[1] for b in meta["buckets"]] == list(tune.S_REPS)
    table = tuning.tuned_table("NVIDIA H200")
    for k, bucket, key, config in meta["buckets"]:
        S = tuning.bucket_size(bucket)
        assert tuple(k) == kind and key == tuning.bucket("bwd_qk", S, 32, 72, 2, "sdpa")
        assert config == table.get(key, tuning.gpu_config("NVIDIA H200", 132, "bwd_qk", bucket, 16, 16, 72, 2, "sdpa"))
    compiled = [m["config"] for m in meta["tune"]]
    expect = {tuple(c[k] for k in tune.SEARCHED): c for c in few + [b[3] for b in meta["buckets"]]}
    assert compiled == list(expect.values())  # the table's own configurations are candidates too
    assert all((out / m["file"]).read_bytes()[:4] == b"\x7fELF" for m in meta["tune"])
    assert capsys.readouterr().out.startswith(f"{len(compiled)} candidate cubins compiled by Triton")


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


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_run_tune_on_the_gpu(kernel, tmp_path, capsys, small_tune):
    """--tune's search on cubins of this machine's Triton: every bucket gets the same checked
    candidate, merged into the table named, whose other entries stay."""
    out, result, table = tmp_path / "cubins", tmp_path / "tune.json", tmp_path / "table.json"
    table.write_text(json.dumps({"other-key": {"BLOCK_S": 1}}))
    assert toolkit.main(["crosstriton", "compile", "--tune", "--out", str(out)]) == 0
    argv = ["crosstriton", "run", str(out), "--calls", "2", "--json", str(result), "--configs-out", str(table)]
    assert toolkit.main(argv) == 0
    meta, run = json.loads((out / "meta.json").read_text()), json.loads(result.read_text())
    written = json.loads(table.read_text())
    keys = [b[2] for b in meta["buckets"]]
    assert set(written) == {"other-key", *keys} and set(run["tuned"]) == set(keys)
    candidates = [m["config"] for m in meta["tune"]]
    assert len({tuple(written[key].items()) for key in keys}) == 1  # one kernel for every size
    for key in keys:
        b = run["buckets"][key]
        assert written[key] == b["best"] in candidates and not b["failed"]
        assert [r["config"] for r in b["us"]] == candidates
        assert all(len(r["us"]) == len(b["sizes"]) and min(r["us"]) > 0 for r in b["us"])
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {table} and {result}"
