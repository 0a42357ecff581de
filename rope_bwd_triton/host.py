"""`python -m rope_bwd_triton host`: host (CPU) time per call of each layer of the rotary
launch path, against transformers' eager function and an identity, on a small CUDA problem
(where host time, not the GPU, sets the pace); and what a never-seen S costs.
Figures are microseconds per call over passes of 200 calls (the GPU synchronized only between
passes): the median and the best pass. The rows take turns, one pass each per round, for 15
rounds, so that a noisy stretch of the host (its speed swings within minutes: RESULTS.md)
lands on every row rather than on whichever row ran then."""

import statistics
import time

import torch

from . import cli
from .load import load_kernel, submodule


def per_call_us(rows, n=200, rounds=15):
    """{name: (median, best) us per call}, the rows interleaved pass by pass."""
    from .timing import interleave

    for fn in rows.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()

    def one_pass(name):
        fn = rows[name]
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        us = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
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


def new_size_us(fn, make, sizes):
    """Host us per forward + backward of `fn` at sizes never seen before (inputs made ahead,
    S of one tuning bucket, whose kernels are compiled first) and at one size over and over:
    (new, seen)."""
    inputs = [make(S) for S in sizes]
    seen = [make(sizes[0] - 1)] * len(sizes)  # also of the bucket: its kernels compile here, untimed
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


def add_arguments(parser):
    parser.add_argument(
        "--no-compile", action="store_true", help="leave out the torch.compile rows (they compile first)"
    )


def main(args=None):
    import triton

    from .e2e import modeling_module

    if not torch.cuda.is_available():
        raise cli.UsageError("host times the launch path on a CUDA GPU: this machine has none")
    modeling = modeling_module("qwen3_omni_moe")
    rope = load_kernel()
    ops, rt, tuning = (submodule(rope, n) for n in ("ops", "rotary_triton", "tuning"))
    S, H, D = 256, 16, 72  # Qwen3-Omni's heads; q and k are views of one qkv projection
    qkv = torch.randn(S, 3, H, D, device="cuda", dtype=torch.bfloat16)
    q, k = qkv[:, 0], qkv[:, 1]
    emb = torch.randn(S, D, device="cuda")
    cos, sin = emb.cos(), emb.sin()
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    cfg = tuning.config_for("fwd", S, H, H, D, 2, q.device)

    def launch():
        rt.launch_fwd(q, k, cos, sin, q_out, k_out, config=cfg)

    def launch_uncached():
        rt._plan.cache_clear()
        launch()

    leaves = [t.detach().clone().requires_grad_() for t in (q, k)]
    grad = torch.randn_like(q)
    grad_sdpa = torch.randn(H, S, D, device="cuda", dtype=q.dtype).transpose(0, 1)  # as sdpa returns it

    def fwd_bwd(fn, g=grad):
        def step():
            torch.autograd.backward(fn(*leaves, cos, sin), (g, g))

        return step

    def fwd_bwd_dynamic(fn):
        """fwd_bwd of torch.compile(fn) with S marked dynamic, as varying image sizes make it,
        and the upstream gradient transposed, as the attention returns it (head stride S*D)."""
        q_, k_ = (t.detach().clone().requires_grad_() for t in (q, k))
        cos_, sin_ = cos.clone(), sin.clone()
        grad_ = torch.randn(H, S, D, device="cuda", dtype=q.dtype).transpose(0, 1)
        for t in (q_, k_, cos_, sin_, grad_):
            torch._dynamo.mark_dynamic(t, 0)
        compiled = torch.compile(fn)

        def step():
            torch.autograd.backward(compiled(q_, k_, cos_, sin_), (grad_, grad_))

        return step

    rows = {
        "rotary_triton.launch, direct launcher (shape seen before)": launch,
        "rotary_triton.launch of a new plan (plan cache cleared; Triton's binder)": launch_uncached,
        "ops._launch (config lookup, device check, launch)": lambda: ops._launch(
            q, k, q_out, k_out, None, None, cos, sin, None, None, adjoint=False
        ),
        "ops.rotary_fwd custom op, no grad": lambda: ops.rotary_fwd(q, k, cos, sin),
        "apply_rotary_pos_emb_vision (eager path), no grad": lambda: rope.apply_rotary_pos_emb_vision(q, k, cos, sin),
        "transformers apply_rotary_pos_emb_vision, no grad": lambda: modeling.apply_rotary_pos_emb_vision(
            q, k, cos, sin
        ),
        "ours forward + backward (eager path)": fwd_bwd(rope.apply_rotary_pos_emb_vision),
        "ours forward + backward (eager path), sdpa's gradient layout": fwd_bwd(
            rope.apply_rotary_pos_emb_vision, grad_sdpa
        ),
        "ours forward + backward (custom op autograd, as traced)": fwd_bwd(ops.rotary_fwd),
        "transformers forward + backward": fwd_bwd(modeling.apply_rotary_pos_emb_vision),
        "identity (q, k) forward + backward": fwd_bwd(lambda q, k, cos, sin: (q, k)),
        "q * 1, k * 1 forward + backward (two aten kernels each way)": fwd_bwd(lambda q, k, cos, sin: (q * 1, k * 1)),
        "same in a Python autograd.Function (its cost over C++ nodes)": fwd_bwd(_Times1.apply),
        "one aten mul (for scale)": lambda: q * 2,
    }
    if not (args and args.no_compile):
        rows.update(
            {
                "ours forward + backward, torch.compile'd": fwd_bwd(torch.compile(rope.apply_rotary_pos_emb_vision)),
                "transformers forward + backward, torch.compile'd": fwd_bwd(
                    torch.compile(modeling.apply_rotary_pos_emb_vision)
                ),
                "ours forward + backward, torch.compile'd, S dynamic": fwd_bwd_dynamic(
                    rope.apply_rotary_pos_emb_vision
                ),
                "transformers forward + backward, torch.compile'd, S dynamic": fwd_bwd_dynamic(
                    modeling.apply_rotary_pos_emb_vision
                ),
            }
        )
    print(
        f"host us per call: S={S}, {H} heads of {D}, bf16, q/k views of qkv; {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}, triton {triton.__version__}"
    )
    print("  median    best")
    for name, (median, best) in per_call_us(rows).items():
        print(f"{median:8.1f} {best:7.1f}  {name}")

    def make(n):
        x = torch.randn(n, 3, H, D, device="cuda", dtype=torch.bfloat16)
        e = torch.randn(n, D, device="cuda")
        g = torch.randn(2, H, n, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        return x[:, 0].requires_grad_(), x[:, 1].requires_grad_(), e.cos(), e.sin(), g[0], g[1]

    print(
        "host us per forward + backward (sdpa's gradient layout), 400 sizes never seen (S = 300..699) "
        "against one size 400 times:"
    )
    for name, fn in (
        ("ours", rope.apply_rotary_pos_emb_vision),
        ("transformers", modeling.apply_rotary_pos_emb_vision),
    ):
        new, seen = new_size_us(fn, make, range(300, 700))
        print(f"{new:8.1f} {seen:7.1f}  {name}: new S, seen S")
