"""`python -m rope_bwd_triton attncheck`: does this torch's attention backward follow the
upstream gradient's strides from call to call?

Qwen vision encoders attend image by image: sdpa runs on [1, H, n, D] slices of one
[1, H, S, D] tensor, so the gradient each call receives is a slice whose head stride is
S*D, S being the tokens of the whole batch. With images of varying sizes an image of n
tokens comes back in batches of other S: same shapes, other strides. On the H200 with
torch 2.11, cuDNN's attention backward reused what it had built for the first such
stride and returned wrong gradients of q, k and v for the others (benchmarks/RESULTS.md).
Not a rope-bwd defect: the rotary sees these gradients as its upstream ones. The check
runs sdpa with one backend on those calls and compares each with float64; exit status 1
when one is off.
"""

from . import cli, output

BACKENDS = {"default": None, "cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION"}
BACKENDS |= {"efficient": "EFFICIENT_ATTENTION", "math": "MATH"}  # names of SDPBackend
TOLERANCE = 1e-2  # bf16 attention against float64: 2-3e-3 when right, about 1.4 when not


def check(attention, n, batches, H, D, dtype, device, generator):
    """For each batch size S: q, k, v [1, H, n, D], the upstream gradient a slice of a
    [1, H, S, D] tensor; rows (S, error of the output, of dq, dk, dv) against float64."""
    import torch

    rows = []
    for S in batches:
        q, k, v = (torch.randn(1, H, n, D, generator=generator).to(device, dtype).requires_grad_() for _ in range(3))
        grad = torch.randn(1, H, S, D, generator=generator).to(device, dtype)[:, :, :n]
        out = attention(q, k, v)
        got = torch.autograd.grad(out, (q, k, v), grad)
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        out64 = torch.nn.functional.scaled_dot_product_attention(*leaves)
        want = torch.autograd.grad(out64, leaves, grad.double())
        errs = [(a.double() - b).norm().item() / b.norm().item() for a, b in zip((out, *got), (out64, *want))]
        rows.append((S, *errs))
    return rows


def _attention(backend):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if BACKENDS[backend] is None:
        return torch.nn.functional.scaled_dot_product_attention
    picked = getattr(SDPBackend, BACKENDS[backend])

    def attention(q, k, v):
        with sdpa_kernel(picked):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    return attention


def add_arguments(parser):
    parser.add_argument("--device", type=cli.device, default="cuda")
    parser.add_argument("--backend", choices=list(BACKENDS), default="cudnn", help="sdpa's backend (default: cudnn)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--tokens", type=cli.positive_int, default=1024, help="tokens of the image (n)")
    parser.add_argument(
        "--batches",
        type=cli.positive_int,
        nargs="+",
        default=[1536, 2048, 2048, 1536],
        help="tokens of the batch per call (S >= n): the upstream gradient's head stride is S*D",
    )
    parser.add_argument("--heads", type=cli.positive_int, default=16)
    parser.add_argument("--head-dim", type=cli.head_dim, default=72)


def main(args):
    import torch

    if min(args.batches) < args.tokens:
        raise cli.UsageError(f"--batches must be at least --tokens ({args.tokens}), got {min(args.batches)}")
    gen = torch.Generator().manual_seed(0)
    dtype = getattr(torch, args.dtype)
    shape = args.tokens, args.batches, args.heads, args.head_dim
    rows = check(_attention(args.backend), *shape, dtype, args.device, gen)
    name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "CPU"
    print(
        f"{name}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, sdpa backend {args.backend}, "
        f"{args.dtype}, "
        f"[1, {args.heads}, {args.tokens}, {args.head_dim}]; error against float64:"
    )
    header = ["call", "batch S", "output", "dq", "dk", "dv"]
    print(output.markdown_table(header, [[i + 1, S, *(f"{e:.2e}" for e in errs)] for i, (S, *errs) in enumerate(rows)]))
    bad = [i + 1 for i, (_, *errs) in enumerate(rows) if max(errs) > TOLERANCE]
    print(f"wrong results in calls {bad}" if bad else "all calls within tolerance")
    return 1 if bad else 0
