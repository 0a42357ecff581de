"""The SOL-ExecBench 019 workload suite and how results are judged.

Shared by the toolkit's commands and its tests: the 16 public workloads, input
generation, the independent float64 reference and the error measures come from
tests/reference.py (the package tests need them where the toolkit is absent: hub
CI); the tolerances, the benchmark's pass rule and the byte floors are the toolkit's own.
"""

# rotate_half here is the toolkit's one (peers.py). The package keeps its own (rotary_torch: it
# stands alone on the Hub), and so does tests/reference.py: it states the math independently of
# the package, in float64, for the package tests. benchmarks/benchmark.py runs alone from a Hub
# snapshot and has its own too.
from tests.reference import (  # noqa: F401  (re-exported)
    HEAD_DIM,
    HEADS,
    SEQ_LENS,
    SOL_ATOL,
    SOL_RTOL,
    make_inputs,
    reference_backward,
    reference_forward,
    reference_vision_forward,
    rel_err,
    rotate_half,
    sol_pass_fraction,
)

SOL_MIN_PASS = 0.99  # at least 99% of the elements inside SOL_ATOL + SOL_RTOL*|ref|
# Relative error (||out - ref|| / ||ref|| against float64) a correct result stays under, by the
# dtype of its outputs (docs/design.md, section 1); float16 has three more mantissa bits than bfloat16.
TOLERANCE = {"float32": 1e-5, "bfloat16": 3e-2, "float16": 4e-3}
TASKS = {  # name: (description, floor_bytes mode, dtype name)
    "bwd": ("full backward, fp32", "bwd", "float32"),
    "bwd_qk": ("q/k-only backward, fp32", "bwd_qk", "float32"),
    "bwd_bf16": ("full backward, bf16 (fp32 table)", "bwd", "bfloat16"),
    "fwd": ("forward, fp32", "fwd", "float32"),
    "fwd_bf16": ("forward, bf16 (fp32 table)", "fwd", "bfloat16"),
}


def floor_bytes(S, H=HEADS, D=HEAD_DIM, *, elem=4, table_elem=4, mode="bwd", HK=None):
    """Bytes that must move through DRAM once.
    bwd: read gq, gk, q, k, emb; write dq, dk, demb.  bwd_qk: read gq, gk, emb; write dq, dk.
    fwd: read q, k, emb; write q_embed, k_embed."""
    HK = H if HK is None else HK
    big = S * (H + HK) * D * elem  # one [S, H, D] tensor for q plus one for k
    if mode == "bwd":
        return 3 * big + 2 * S * D * table_elem
    if mode in ("bwd_qk", "fwd"):
        return 2 * big + S * D * table_elem
    raise ValueError(f"unknown mode {mode!r}")


def judge(outputs, refs, dtype_name, rows) -> dict:
    """Outputs on token `rows` against their float64 references: relative error per output, the
    worst, SOL-ExecBench's pass fraction, and ok: within TOLERANCE of the outputs' dtype with
    SOL-ExecBench's rule met on at least SOL_MIN_PASS of the elements."""
    picked = [o[rows.to(o.device)] for o in outputs]
    errs = [rel_err(o, r) for o, r in zip(picked, refs)]
    passes = min(sol_pass_fraction(o, r) for o, r in zip(picked, refs))
    worst, tolerance = max(errs), TOLERANCE[dtype_name]
    return {
        "rel_err": errs,
        "max_rel_err": worst,
        "sol_pass_fraction": passes,
        "tolerance": tolerance,
        "ok": worst <= tolerance and passes >= SOL_MIN_PASS,
        "rows": len(rows),
    }


def verify_rows(S, n, seed):
    """Token rows to verify (tokens are independent): all of them, or n spread at random
    including the first and last."""
    import torch

    if S <= n:
        return torch.arange(S)
    pick = torch.randperm(S - 2, generator=torch.Generator().manual_seed(seed))[: n - 2] + 1
    return torch.cat((torch.tensor([0, S - 1]), pick)).sort().values


def failures(runs, where, prefixes=("ours", "ab")) -> list:
    """ "<implementation> <where(workload)>" of each result in the runs that failed verification or
    did not run, of the implementations whose names start with one of `prefixes` (by default ours
    and the other builds of ours, --ab)."""
    return [
        f"{name} {where(w)}"
        for run in runs
        for w in run["workloads"]
        for name, r in w["results"].items()
        if name.startswith(prefixes) and ("error" in r or not r.get("verify", {}).get("ok", True))
    ]
