"""The float64 reference every package test is judged by, and the workloads it runs.

It stands on torch alone (hub CI's test environment has torch, kernels and pytest):
input generation, the math evaluated in float64 (the backward by float64 autograd of
the eager forward, written as SOL-ExecBench's and transformers' references are: cos/sin
of cat(emb, emb)[:, :D], rotate_half, rotate_pairwise, partial rotary as a slice and a
cat), error measures and the benchmark's pass rule. The toolkit's workload suite
(rope_bwd_triton.suite) re-exports it.
"""

import torch

SEQ_LENS = (128, 131, 211, 256, 449, 512, 613, 919, 1024, 1423, 2213, 2521, 2851, 3169, 3803, 4096)
HEADS, HEAD_DIM = 16, 128
SOL_ATOL = SOL_RTOL = 1e-2  # |out - ref| <= atol + rtol*|ref| ...


def make_inputs(
    S, H=HEADS, D=HEAD_DIM, *, HK=None, dtype=torch.float32, table_dtype=torch.float32, device="cpu", generator=None
):
    """Fresh random inputs of one workload: grad_q_embed, grad_k_embed, q, k [S, H, D], embeddings [S, D]."""
    HK = H if HK is None else HK

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=generator, dtype=torch.float32).to(device=device, dtype=dt)

    return {
        "grad_q_embed": rnd(S, H, D),
        "grad_k_embed": rnd(S, HK, D),
        "q": rnd(S, H, D),
        "k": rnd(S, HK, D),
        "embeddings": rnd(S, D, dt=table_dtype),
    }


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_pairwise(x):
    """transformers' rotate_pairwise: (x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def reference_vision_forward(q, k, cos, sin, interleaved=False):
    """transformers' apply_rotary_pos_emb_vision, in the dtype of its inputs: cos/sin [S, R]
    with R <= D; the first R channels of each head rotate (rotate_half, or rotate_pairwise
    when interleaved), the other D - R pass through (partial rotary)."""
    rot = cos.shape[-1]
    turn = rotate_pairwise if interleaved else rotate_half
    c, s = cos[:, None, :], sin[:, None, :]

    def apply(x):
        x_rot, x_pass = x[..., :rot], x[..., rot:]
        return torch.cat((x_rot * c + turn(x_rot) * s, x_pass), dim=-1)

    return apply(q), apply(k)


def reference_forward(q, k, embeddings):
    D = q.shape[-1]
    emb = torch.cat((embeddings, embeddings), dim=-1)[:, :D]
    return reference_vision_forward(q, k, emb.cos(), emb.sin())


def reference_backward(grad_q_embed, grad_k_embed, q, k, embeddings):
    """(grad_q, grad_k, grad_embeddings) by float64 autograd of reference_forward, on the CPU."""
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, embeddings)]
    outs = reference_forward(*leaves)
    grads = [g.detach().cpu().double() for g in (grad_q_embed, grad_k_embed)]
    return torch.autograd.grad(outs, leaves, grads)


def reference_rotary(q, k, table, sin=None, *, interleaved=False):
    """The rotation by a table [S, R]: the angles when sin is None, else cos (any R <= D)."""
    cos, sin = (table.cos(), table.sin()) if sin is None else (table, sin)
    return reference_vision_forward(q, k, cos, sin, interleaved)


def reference_rotary_grads(gq, gk, q, k, table, sin=None, *, interleaved=False):
    """float64 on the CPU: (outputs, gradients) of reference_rotary, the gradients those of
    q, k, the table and (given) sin for the upstream gradients gq, gk."""
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, table, sin) if t is not None]
    outs = reference_rotary(*leaves[:3], *leaves[3:], interleaved=interleaved)
    grads = torch.autograd.grad(outs, leaves, [g.detach().cpu().double() for g in (gq, gk)])
    return [o.detach() for o in outs], list(grads)


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 (0 for empty tensors); NaN in out gives NaN."""
    out, ref = out.detach().cpu().double(), ref.detach().cpu().double()
    if ref.numel() == 0:
        return 0.0
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def sol_pass_fraction(out, ref) -> float:
    """Fraction of elements inside SOL-ExecBench's tolerance."""
    out, ref = out.detach().cpu().double(), ref.detach().cpu().double()
    if ref.numel() == 0:
        return 1.0
    ok = (out - ref).abs() <= SOL_ATOL + SOL_RTOL * ref.abs()
    return ok.double().mean().item()
