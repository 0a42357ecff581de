"""`python -m rope_bwd_triton attncheck`: does this torch's attention backward follow the
upstream gradient's strides from call to call?

Attention run image by image, as Qwen vision encoders run it without flash-attention, calls
sdpa on [1, H, n, D] slices and concatenates the outputs, so each call's upstream gradient is
a slice of one tensor of the whole batch's S tokens. With images of varying sizes an image
of n tokens comes back in batches of other S: same shapes, other strides. Two layouts:
- heads: outputs concatenated as [1, H, S, D]; the gradient's head stride is S*D.
- tokens: outputs concatenated as [1, S, H, D] (transformers' Qwen vision attention); only
  the batch stride, S*H*D, changes with S.
On the H200 with torch 2.11, cuDNN's attention backward reused what it had built for the
first head stride and returned wrong gradients of q, k and v for the others (layout heads);
in layout tokens every backend was right (benchmarks/RESULTS.md). Not a rope-bwd defect: the
rotary's upstream gradient is what this backward returns. The check runs sdpa with one
backend on such calls and compares each with float64; exit status 1 when one is off.
"""

from . import cli, output, suite

BACKENDS = {  # --backend: the name of its SDPBackend (None: torch's own choice)
    "default": None,
    "cudnn": "CUDNN_ATTENTION",
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}
LAYOUTS = ("heads", "tokens")
TOLERANCE = 1e-2  # bf16 attention against float64: 2-3e-3 when right, about 1.4 when not


def upstream(S, n, H, D, layout, dtype, device, generator):
    """The [1, H, n, D] gradient of one image's attention output: a slice of the batch's."""
    import torch

    if layout == "heads":
        return torch.randn(1, H, S, D, generator=generator).to(device, dtype)[:, :, :n]
    return torch.randn(1, S, H, D, generator=generator).to(device, dtype)[:, :n].transpose(1, 2)


def check(attention, n, batches, H, D, layout, dtype, device, generator):
    """For each batch size S: q, k, v [1, H, n, D] and the upstream gradient in `layout`; rows
    (S, error of the output, of dq, dk, dv) against float64."""
    import torch

    rows = []
    for S in batches:
        q, k, v = (torch.randn(1, H, n, D, generator=generator).to(device, dtype).requires_grad_() for _ in range(3))
        grad = upstream(S, n, H, D, layout, dtype, device, generator)
        out = attention(q, k, v)
        got = torch.autograd.grad(out, (q, k, v), grad)
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        out64 = torch.nn.functional.scaled_dot_product_attention(*leaves)
        want = torch.autograd.grad(out64, leaves, grad.double())
        rows.append((S, *map(suite.rel_err, (out, *got), (out64, *want))))
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
    parser.add_argument(
        "--layout", choices=LAYOUTS, default="heads", help="how the outputs are concatenated (module docstring)"
    )
    parser.add_argument("--tokens", type=cli.positive_int, default=1024, help="tokens of the image (n)")
    parser.add_argument(
        "--batches",
        type=cli.positive_int,
        nargs="+",
        default=[1536, 2048, 2048, 1536],
        help="tokens of the batch per call (S >= n)",
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
    rows = check(_attention(args.backend), *shape, args.layout, dtype, args.device, gen)
    name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "CPU"
    print(
        f"{name}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, sdpa backend {args.backend}, "
        f"{args.dtype}, [1, {args.heads}, {args.tokens}, {args.head_dim}], upstream gradient layout {args.layout}; "
        "error against float64:"
    )
    header = ["call", "batch S", "output", "dq", "dk", "dv"]
    print(output.markdown_table(header, [[i + 1, S, *(f"{e:.2e}" for e in errs)] for i, (S, *errs) in enumerate(rows)]))
    bad = [i + 1 for i, (_, *errs) in enumerate(rows) if max(errs) > TOLERANCE]
    print(f"wrong results in calls {bad}" if bad else "all calls within tolerance")
    return 1 if bad else 0
