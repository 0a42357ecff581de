"""`python -m rope_bwd_triton realcall`: the call a Qwen vision encoder's training step makes, timed.

The call: q and k are views of one packed qkv [S, 3, H, D] (bf16 or fp16), cos and sin
[S, D] fp32 come from a buffer (no gradient); the forward runs, then the backward of q
and k from the upstream gradient as the attention returns it: sdpa's [1, H, S, D] seen as
[S, H, D] (head stride S*D), or flash-attention's contiguous [S, H, D]. One timed call is
the forward and the backward (torch.autograd.grad of q and k), GPU time on a cold L2 as
the bench times it (timing.py).

Implementations: ours (loaded through kernels.get_kernel), transformers' eager function,
torch.compile of it (one compilation per shape), Liger-Kernel's vision rotary, and
optionally another build of ours (--ab, for A/B comparisons in one process). The
reference is a copy of the same bytes in the same number of launches: one device copy
of the forward's bytes and one of the backward's.
"""

import json
import statistics
import sys
from pathlib import Path

from . import REPO_ROOT, cli, output

LAYOUTS = ("sdpa", "flash")
SEQ_LENS = (256, 1024, 4096, 16384, 65536)
HEAD_DIMS = (72, 80, 128)
PEERS = ("copy", "compile", "liger", "transformers")
QUICK = {"seq_lens": (8, 33), "head_dims": (8,), "heads": 2, "calls": 3}


def make_inputs(S, H, D, dtype, layout, device, generator):
    """q, k (leaf views of one qkv [S, 3, H, D]), cos, sin [S, D] fp32, and the upstream
    gradients gq, gk [S, H, D] in `layout`."""
    import torch

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dt)

    q, k, _ = rnd(S, 3, H, D).unbind(1)
    emb = rnd(S, D // 2, dt=torch.float32).repeat(1, 2)  # cat(freqs, freqs), as the models build it
    if layout == "sdpa":
        gq, gk = (rnd(1, H, S, D).transpose(1, 2)[0] for _ in range(2))
    else:
        gq, gk = rnd(S, H, D), rnd(S, H, D)
    return {"q": q.requires_grad_(), "k": k.requires_grad_(), "cos": emb.cos(), "sin": emb.sin(), "gq": gq, "gk": gk}


def floor_bytes(S, H, D, elem):
    """Bytes the call must move: forward reads q, k, cos, sin and writes q_embed, k_embed;
    backward reads gq, gk, cos, sin and writes dq, dk (the tables are fp32)."""
    heads, tables = 2 * S * H * D * elem, 2 * S * D * 4
    return {"fwd": 2 * heads + tables, "bwd": 2 * heads + tables}


class FwdBwd:
    """One real call of `fn` (q, k, cos, sin) -> (q_embed, k_embed): forward, then the
    gradients of q and k; keeps the latest (q_embed, k_embed, dq, dk)."""

    def __init__(self, fn, x):
        self.fn, self.x, self.last = fn, x, ()

    def __call__(self):
        import torch

        x = self.x
        out = self.fn(x["q"], x["k"], x["cos"], x["sin"])
        self.last = (*out, *torch.autograd.grad(out, (x["q"], x["k"]), (x["gq"], x["gk"])))


class Copies:
    """The reference: one device copy of the forward's bytes, one of the backward's."""

    def __init__(self, nbytes, device):
        import torch

        sources = [
            torch.randint(0, 256, (n // 2,), dtype=torch.uint8, device=device) for n in (nbytes["fwd"], nbytes["bwd"])
        ]
        self.pairs = [(src, torch.empty_like(src)) for src in sources]

    def __call__(self):
        for src, dst in self.pairs:
            dst.copy_(src)

    def ok(self):
        import torch

        return all(torch.equal(src, dst) for src, dst in self.pairs)


def _transformers_fn():
    from .e2e import modeling_module

    return modeling_module("qwen3_omni_moe").apply_rotary_pos_emb_vision


def implementations(kernel, others, peers):
    """name -> (label, fn(q, k, cos, sin) -> (q_embed, k_embed)) of the implementations to time;
    `others`: other builds of ours (A/B), named ab, ab2, ..."""
    impls = {"ours": ("ours", kernel.apply_rotary_pos_emb_vision)}
    for i, other in enumerate(others):
        impls["ab" if i == 0 else f"ab{i + 1}"] = (f"A/B: {other.__name__}", other.apply_rotary_pos_emb_vision)
    if "compile" in peers:
        from .peers import compiled

        impls["compile"] = ("torch.compile(transformers)", compiled(_transformers_fn()))
    if "liger" in peers:
        try:
            from liger_kernel.transformers.rope import liger_rotary_pos_emb_vision
        except ImportError:
            liger_rotary_pos_emb_vision = None
        if liger_rotary_pos_emb_vision is not None:
            impls["liger"] = ("Liger-Kernel", liger_rotary_pos_emb_vision)
    if "transformers" in peers:
        impls["transformers"] = ("transformers (eager)", _transformers_fn())
    return impls


def _verify(last, x, rows, dtype_name):
    """(q_embed, k_embed, dq, dk) on token rows against float64 autograd of the math."""
    import torch

    from . import suite

    pick = rows.to(x["q"].device)
    leaves = [x[n].detach()[pick].cpu().double().requires_grad_() for n in ("q", "k")]
    tables = [x[n][pick].cpu().double() for n in ("cos", "sin")]
    outs = suite.reference_vision_forward(*leaves, *tables)
    grads = torch.autograd.grad(outs, leaves, [x[n][pick].cpu().double() for n in ("gq", "gk")])
    err = max(suite.rel_err(o[pick], r) for o, r in zip(last, (*outs, *grads)))
    return {"max_rel_err": err, "ok": err <= suite.TOLERANCE[dtype_name]}


def measure(args) -> dict:
    import torch
    from tqdm import tqdm

    from .bench import _rows
    from .load import load_kernel, load_other
    from .runmeta import run_meta
    from .timing import ColdL2Timer

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    kernel = load_kernel()
    others = [load_other(path) for path in args.ab or ()]
    timer = ColdL2Timer(device, calls=args.calls, primary="span" if device.type == "cuda" else "events")
    impls = implementations(kernel, others, set(args.peers))
    workloads = [
        (dt, D, lay, S) for dt in args.dtypes for D in args.head_dims for lay in args.layouts for S in args.seq_lens
    ]
    meta = run_meta(device, kernel=kernel, timer=timer, heads=args.heads, ab=[str(p) for p in args.ab or ()])
    rows_out = []
    n_runs = len(workloads) * (len(impls) + ("copy" in args.peers))
    with tqdm(total=n_runs, desc="realcall", unit="run", file=sys.stderr) as bar:
        for dtype_name, D, layout, S in workloads:
            dtype = getattr(torch, dtype_name)
            gen = torch.Generator().manual_seed(args.seed * 1_000_003 + S * 1009 + D)
            x = make_inputs(S, args.heads, D, dtype, layout, device, gen)
            rows = _rows(S, args.verify_tokens, args.seed + S)
            nbytes = floor_bytes(S, args.heads, D, dtype.itemsize)
            entry = {
                "dtype": dtype_name,
                "D": D,
                "layout": layout,
                "S": S,
                "H": args.heads,
                "bytes": sum(nbytes.values()),
                "results": {},
            }
            calls = {name: FwdBwd(fn, x) for name, (_, fn) in impls.items()}
            if "copy" in args.peers:
                calls["copy"] = Copies(nbytes, device)
            for name, call in calls.items():
                bar.set_postfix_str(f"{dtype_name} D={D} {layout} S={S} {name}")
                try:
                    call()
                    check = {"ok": call.ok()} if name == "copy" else _verify(call.last, x, rows, dtype_name)
                    stats = timer(call)
                    entry["results"][name] = {"time": stats.as_dict(), "verify": check}
                    if not check["ok"]:
                        bar.write(f"  {name} {dtype_name} D={D} {layout} S={S}: verification FAILED {check}")
                except Exception as exc:  # a failing peer must not cost the whole run
                    entry["results"][name] = {"error": f"{type(exc).__name__}: {exc}"}
                    bar.write(f"  {name} {dtype_name} D={D} {layout} S={S}: {entry['results'][name]['error']}")
                bar.update()
            rows_out.append(entry)
            del x, calls
            if device.type == "cuda":
                torch.cuda.empty_cache()
    labels = {name: label for name, (label, _) in impls.items()}
    labels["copy"] = "copy of the same bytes (2 launches)"
    return {"meta": meta, "labels": labels, "workloads": rows_out}


def _us(entry, name):
    r = entry["results"].get(name, {})
    return r["time"]["mean_us"] if "time" in r else None


def markdown(run) -> str:
    meta, labels = run["meta"], run["labels"]
    names = [n for n in labels if n != "ours"]
    header = ["dtype", "D", "grad layout", "S", "ours us"]
    for n in names:
        header += [f"{labels[n]} us", f"ours / {n}"]
    rows = []
    for w in run["workloads"]:
        ours = _us(w, "ours")
        row = [w["dtype"], w["D"], w["layout"], w["S"], f"{ours:.1f}" if ours else "—"]
        for n in names:
            t = _us(w, n)
            row += [f"{t:.1f}" if t else "—", f"{ours / t:.3f}" if t and ours else "—"]
        rows.append(row)
    fails = [
        f"{n} {w['dtype']} D={w['D']} {w['layout']} S={w['S']}"
        for w in run["workloads"]
        for n, r in w["results"].items()
        if "error" in r or not r.get("verify", {}).get("ok", True)
    ]
    gpu = meta.get("gpu") or f"{meta['device']} ({meta.get('note', '')})"
    lines = [
        f"Real call (q/k views of one qkv, cos/sin without gradient, forward + backward of q and k), "
        f"{meta['heads']} heads; {gpu}; {meta['timer']}; mean of {meta['calls']} calls; "
        f"torch {meta['versions']['torch']}, triton {meta['versions']['triton']}; {meta['date']}.  ",
        f"Command: `{meta['command']}`",
        "",
        output.markdown_table(header, rows),
        "",
        "Verification (float64, before timing): " + ("all passed." if not fails else "FAILED: " + "; ".join(fails)),
    ]
    ratios = [_us(w, "ours") / _us(w, "copy") for w in run["workloads"] if _us(w, "ours") and _us(w, "copy")]
    if ratios:
        lines.append(
            f"Ours / copy: geometric mean {statistics.geometric_mean(ratios):.3f}, "
            f"range {min(ratios):.3f}-{max(ratios):.3f}."
        )
    return "\n".join(lines) + "\n"


def render_plot(run, path, plt):
    groups = sorted({(w["dtype"], w["D"], w["layout"]) for w in run["workloads"]})
    fig, ax = plt.subplots(figsize=(8, 5))
    for dtype, D, layout in groups:
        ws = sorted(
            (w for w in run["workloads"] if (w["dtype"], w["D"], w["layout"]) == (dtype, D, layout)),
            key=lambda w: w["S"],
        )
        pts = [(w["S"], _us(w, "ours") / _us(w, "copy")) for w in ws if _us(w, "ours") and _us(w, "copy")]
        if pts:
            ax.plot(*zip(*pts), "-o", ms=3, label=f"{dtype} D={D} {layout}")
    ax.axhline(1.0, color="k", ls="--", lw=1, label="copy of the same bytes")
    ax.set(
        xscale="log",
        xlabel="S (tokens)",
        ylabel="ours / copy (time)",
        title=f"real call, forward + backward, {run['meta'].get('gpu') or 'CPU (meaningless)'}",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    output.save_figure(fig, path)


def add_arguments(parser):
    out = REPO_ROOT / "results"
    parser.add_argument("--seq-lens", type=cli.positive_int, nargs="+", default=list(SEQ_LENS))
    parser.add_argument("--head-dims", type=cli.head_dim, nargs="+", default=list(HEAD_DIMS))
    parser.add_argument("--heads", type=cli.positive_int, default=16)
    parser.add_argument("--dtypes", nargs="+", choices=("bfloat16", "float16"), default=["bfloat16"])
    parser.add_argument(
        "--layouts",
        nargs="+",
        choices=LAYOUTS,
        default=list(LAYOUTS),
        help="upstream gradient: sdpa's [1, H, S, D] transposed, or flash-attention's [S, H, D]",
    )
    parser.add_argument(
        "--peers",
        type=cli.subset_of(PEERS, "peers"),
        default=list(PEERS),
        help=f"comma-separated subset of {','.join(PEERS)}",
    )
    parser.add_argument(
        "--ab", type=Path, nargs="+", help="also time other builds of ours: checkouts with build/ (A/B in one process)"
    )
    parser.add_argument("--calls", type=cli.positive_int, default=40)
    parser.add_argument("--verify-tokens", type=cli.positive_int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", type=cli.device, help="default: cuda if available, else cpu")
    parser.add_argument("--quick", action="store_true", help=f"tiny CPU-friendly run of the code path ({QUICK})")
    parser.add_argument("--json", type=Path, default=out / "realcall.json")
    parser.add_argument("--markdown", type=Path, default=out / "realcall.md")
    parser.add_argument("--plot", type=Path, default=out / "realcall.png")


def main(args) -> int:
    if args.quick:
        args.seq_lens, args.head_dims, args.heads, args.calls = (
            list(QUICK["seq_lens"]),
            list(QUICK["head_dims"]),
            QUICK["heads"],
            QUICK["calls"],
        )
    missing = [str(p) for p in args.ab or () if not (p / "build").is_dir()]
    if missing:
        raise cli.UsageError(f"--ab: no build/ in {', '.join(missing)} (run `python -m rope_bwd_triton build` there)")
    run = measure(args)
    for path in (args.json, args.markdown, args.plot):
        path.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(run, indent=1) + "\n")
    text = markdown(run)
    args.markdown.write_text(text)
    plt = output.pyplot("realcall", args.plot)
    if plt:
        render_plot(run, args.plot, plt)
    print(text)
    print(f"wrote {args.json}, {args.markdown} and {args.plot}")
    failed = [
        r
        for w in run["workloads"]
        for n, r in w["results"].items()
        if (n == "ours" or n.startswith("ab")) and ("error" in r or not r["verify"]["ok"])
    ]
    return 1 if failed else 0
