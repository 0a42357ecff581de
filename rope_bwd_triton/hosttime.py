"""`overhead`'s second part: host (CPU) time per call of each layer of the rotary launch path,
against transformers' eager function and an identity, on a small CUDA problem (where host
time, not the GPU, sets the pace); and what a never-seen S costs.

Figures are microseconds per call over passes of 200 calls (the GPU synchronized only between
passes): the median and the best pass. The rows take turns, one pass each per round, for 15
rounds, so that a noisy stretch of the host (its speed swings within minutes) lands on every
row rather than on whichever row ran then. The parent runs this in one fresh process per
fast-launch setting (ROPE_BWD_FAST_LAUNCH=0 turns the package's private-internals launch off).
"""

import statistics
import time

import torch

from . import output

S, H, D = 256, 16, 72  # Qwen3-Omni's heads; q and k are views of one qkv projection
NEW_SIZES = range(300, 700)


def per_call_us(rows, n=200, rounds=15, sync=torch.cuda.synchronize):
    """{name: (median, best) us per call}, the rows interleaved pass by pass."""
    from .timing import interleave

    for fn in rows.values():
        for _ in range(20):
            fn()
    sync()

    def one_pass(name):
        fn = rows[name]
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        us = (time.perf_counter() - t0) / n * 1e6
        sync()
        return us

    passes = interleave(rows, one_pass, rounds)
    return {name: (statistics.median(p), min(p)) for name, p in passes.items()}


class _Times1(torch.autograd.Function):
    """q * 1, k * 1 with a Python backward: the floor for any autograd.Function of two kernels."""

    @staticmethod
    def forward(ctx, q, k, cos, sin):
        return q * 1, k * 1

    @staticmethod
    def backward(ctx, gq, gk):
        return gq * 1, gk * 1, None, None


def _inputs(n):
    """q, k (leaf views of one qkv), cos, sin, and the upstream gradients as sdpa returns them."""
    x = torch.randn(n, 3, H, D, device="cuda", dtype=torch.bfloat16)
    e = torch.randn(n, D, device="cuda")
    g = torch.randn(2, H, n, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    return x[:, 0].requires_grad_(), x[:, 1].requires_grad_(), e.cos(), e.sin(), g[0], g[1]


def new_size_us(fn, sizes):
    """Host us per forward + backward of `fn` at sizes never seen before (inputs made ahead,
    S of one tuning bucket, whose kernels are compiled first) and at one size over and over:
    (new, seen)."""
    inputs = [_inputs(n) for n in sizes]
    seen = [_inputs(sizes[0] - 1)] * len(sizes)  # also of the bucket: its kernels compile here, untimed
    q, k, cos, sin, gq, gk = seen[0]
    torch.autograd.grad(fn(q, k, cos, sin), (q, k), (gq, gk))
    out = []
    for batch in (inputs, seen):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for q, k, cos, sin, gq, gk in batch:
            torch.autograd.grad(fn(q, k, cos, sin), (q, k), (gq, gk))
        out.append((time.perf_counter() - t0) / len(batch) * 1e6)
        torch.cuda.synchronize()
    return out


def _rows(rope, modeling, compile_rows, other=None):
    from .load import submodule

    launch = submodule(rope, "launch")
    qkv = torch.randn(S, 3, H, D, device="cuda", dtype=torch.bfloat16)
    q, k = qkv[:, 0], qkv[:, 1]
    emb = torch.randn(S, D, device="cuda")
    cos, sin = emb.cos(), emb.sin()
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    cfg = submodule(rope, "tuning").get_config("fwd", S, H, H, D, 2, q.device)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k)]
    grad = torch.randn_like(q)
    grad_sdpa = torch.randn(H, S, D, device="cuda", dtype=q.dtype).transpose(0, 1)  # as sdpa returns it

    def fwd_bwd(fn, g=grad):
        return lambda: torch.autograd.backward(fn(*leaves, cos, sin), (g, g))

    def fwd_bwd_dynamic(fn):
        """fwd_bwd of torch.compile(fn) with S marked dynamic, as varying image sizes make it,
        and the upstream gradient transposed, as the attention returns it (head stride S*D)."""
        q_, k_ = (t.detach().clone().requires_grad_() for t in (q, k))
        cos_, sin_ = cos.clone(), sin.clone()
        grad_ = torch.randn(H, S, D, device="cuda", dtype=q.dtype).transpose(0, 1)
        for t in (q_, k_, cos_, sin_, grad_):
            torch._dynamo.mark_dynamic(t, 0)
        compiled = torch.compile(fn)
        return lambda: torch.autograd.backward(compiled(q_, k_, cos_, sin_), (grad_, grad_))

    def op_fwd(q, k, cos, sin):
        return rope.ops.rotary_fwd(q, k, cos, sin, False)

    ours, theirs = rope.apply_rotary_pos_emb_vision, modeling.apply_rotary_pos_emb_vision
    rows = {
        "launch.launch_fwd, configuration given": lambda: launch.launch_fwd(
            q=q, k=k, q_out=q_out, k_out=k_out, cos=cos, sin=sin, config=cfg
        ),
        "launch.launch_fwd, configuration looked up": lambda: launch.launch_fwd(
            q=q, k=k, q_out=q_out, k_out=k_out, cos=cos, sin=sin
        ),
        "ops.rotary_fwd custom op, no grad": lambda: op_fwd(q, k, cos, sin),
        "apply_rotary_pos_emb_vision (eager path), no grad": lambda: ours(q, k, cos, sin),
        "transformers apply_rotary_pos_emb_vision, no grad": lambda: theirs(q, k, cos, sin),
        "ours forward + backward (eager path)": fwd_bwd(ours),
        "ours forward + backward (eager path), sdpa's gradient layout": fwd_bwd(ours, grad_sdpa),
        "ours forward + backward (custom op autograd, as traced)": fwd_bwd(op_fwd),
        "transformers forward + backward": fwd_bwd(theirs),
        "identity (q, k) forward + backward": fwd_bwd(lambda q, k, cos, sin: (q, k)),
        "q * 1, k * 1 forward + backward (two aten kernels each way)": fwd_bwd(lambda q, k, cos, sin: (q * 1, k * 1)),
        "same in a Python autograd.Function (its cost over C++ nodes)": fwd_bwd(_Times1.apply),
        "one aten mul (for scale)": lambda: q * 2,
    }
    if other is not None:  # overhead --ab
        rows["A/B build forward + backward (eager path), sdpa's gradient layout"] = fwd_bwd(
            other.apply_rotary_pos_emb_vision, grad_sdpa
        )
    if compile_rows:
        rows.update(
            {
                "ours forward + backward, torch.compile'd": fwd_bwd(torch.compile(ours)),
                "transformers forward + backward, torch.compile'd": fwd_bwd(torch.compile(theirs)),
                "ours forward + backward, torch.compile'd, S dynamic": fwd_bwd_dynamic(ours),
                "transformers forward + backward, torch.compile'd, S dynamic": fwd_bwd_dynamic(theirs),
            }
        )
    return rows


def child(compile_rows: bool, ab=None) -> dict:
    """Runs in the fresh process: {"rows": {name: [median, best]}, "new_size": {impl: [new, seen]}};
    `ab`: another build of ours to time beside."""
    from .load import load_kernel, load_other
    from .models import modeling_module

    rope, modeling = load_kernel(build=False), modeling_module()
    other = load_other(ab) if ab else None
    rows = per_call_us(_rows(rope, modeling, compile_rows, other))
    impls = [("ours", rope.apply_rotary_pos_emb_vision), ("transformers", modeling.apply_rotary_pos_emb_vision)]
    if other is not None:
        impls.append(("ab", other.apply_rotary_pos_emb_vision))
    new = {name: new_size_us(fn, NEW_SIZES) for name, fn in impls}
    return {"rows": rows, "new_size": new}


def markdown(runs, meta) -> str:
    """{setting: child's result} as two tables, a column pair per fast-launch setting."""
    ok = {setting: r for setting, r in runs.items() if "error" not in r}

    def table(first, key, names, labels):
        header = [first] + [f"fast launch {setting}: {label}" for setting in ok for label in labels]
        nan = (float("nan"),) * 2
        return output.markdown_table(
            header, [[n, *(f"{x:.1f}" for r in ok.values() for x in r[key].get(n, nan))] for n in names]
        )

    names = list(dict.fromkeys(n for r in ok.values() for n in r["rows"]))
    impls = list(next(iter(ok.values()))["new_size"]) if ok else []
    v = meta["versions"]
    return (
        "\n".join(
            [
                f"Host us per call: S={S}, {H} heads of {D}, bf16, q/k views of qkv; each fast-launch setting in a "
                f"fresh process; {meta['gpu']}, torch {v['torch']}, triton {v['triton']}; {meta['date']}.",
                "",
                table("call", "rows", names, ("median us", "best us")),
                "",
                f"Host us per forward + backward (sdpa's gradient layout) over {len(NEW_SIZES)} sizes never seen "
                f"(S = {NEW_SIZES.start}..{NEW_SIZES.stop - 1}), and over one size as often:",
                "",
                table("implementation", "new_size", impls, ("new S us", "seen S us")),
                *(f"fast launch {setting}: {r['error']}" for setting, r in runs.items() if "error" in r),
            ]
        )
        + "\n"
    )
