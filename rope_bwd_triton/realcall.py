"""`python -m rope_bwd_triton bench --preset realcall`: the call a Qwen vision encoder's
training step makes, timed.

The call: q and k are views of one packed qkv [S, 3, H, D] (bf16 or fp16), cos and sin
[S, D] fp32 come from a buffer (no gradient); --variants adds the other forms families use:
interleaved pairs (inkling2), partial rotary (2 channels of each head passed through, as
minimax_m3_vl), and bf16 tables (what `model.to(torch.bfloat16)` makes); the forward runs, then the backward of q
and k from the upstream gradient as the attention returns it: sdpa's [1, H, S, D] seen as
[S, H, D] (head stride S*D), or flash-attention's contiguous [S, H, D]. One timed call is
the forward and the backward (torch.autograd.grad of q and k), GPU time on a cold L2 as
the bench times it (timing.py).

Implementations: ours (loaded through kernels.get_kernel), transformers' eager function,
torch.compile of it (one compilation per shape), Liger-Kernel's vision rotary, and
optionally other builds of ours (--ab, for A/B comparisons in one process). The
reference is a copy of the same bytes in the same number of launches: one device copy
of the forward's bytes and one of the backward's.

`--preset decoder`: the decoders' call, transformers' `apply_rotary_pos_emb(q, k, cos, sin)`,
as their attention makes it: q [B, HQ, S, D] and k [B, HK, S, D] views of the q and k
projections (`[B, S, H*D] -> view(B, S, H, D).transpose(1, 2)`), cos/sin [B, S, D] in q's
dtype (transformers' rotary embedding casts them to x.dtype), the upstream gradient as sdpa
returns it (contiguous [B, H, S, D]; flash: [B, S, H, D] transposed). Shapes: Llama-3-8B's and
Qwen3-Omni's Thinker's heads (models.decoder_shapes). Peers: transformers' function (the plain
one under its hub decorator), torch.compile of it, Liger-Kernel's liger_rotary_pos_emb (which
rotates its inputs in place: it gets copies of its own). Verified on token rows (b, s).
`--preset decode`: that call in a generation step, the forward alone under no grad (S = 1 at
every batch, longer S, a prefill, at B = 1): GPU time as above, and wall time per call in a loop
of calls (hosttime.per_call_us), which the host's time per call sets.
"""

import statistics
import sys

from . import output, suite
from .measure import ab_name

LAYOUTS = ("sdpa", "flash")
SEQ_LENS = (256, 1024, 4096, 16384, 65536)
HEAD_DIMS = (72, 80, 128)
PEERS = ("copy", "compile", "liger", "transformers")
VARIANTS = ("halves", "interleaved", "partial", "bf16-tables")
DECODER_SEQ_LENS = (2048, 8192, 32768)
BATCHES = (1, 4)
# The families preset: name -> (transformers family, query heads, key/value heads, head_dim, table
# width, prefix tokens), each family's released call: GPT-OSS-120B's attention (a table value per
# pair), DeepSeek-V4's (one tensor per call: q, then the one key/value head; a 64-channel rope
# slice, 32 pairs, at the end of each head of 512), DINOv3 ViT-L's (its class and 4 register tokens
# pass through).
FAMILY_CALLS = {
    "gpt-oss": ("gpt_oss", 64, 8, 64, 32, 0),
    "deepseek-v4": ("deepseek_v4", 64, 1, 512, 32, 0),
    "dinov3-vitl": ("dinov3_vit", 16, 16, 64, 64, 5),
}
# (name, B, S): the decoders at B = 1, S = 8192; DINOv3 on 32 images of 224 and of 512 pixels (patches of 16)
FAMILY_WORKLOADS = [("gpt-oss", 1, 8192), ("deepseek-v4", 1, 8192), ("dinov3-vitl", 32, 14 * 14 + 5),
                    ("dinov3-vitl", 32, 32 * 32 + 5)]  # fmt: skip
QUICK_FAMILY_WORKLOADS = [("gpt-oss", 1, 8), ("deepseek-v4", 2, 5), ("dinov3-vitl", 2, 9)]


def make_inputs(S, H, D, dtype, layout, device, generator, variant="halves"):
    """q, k (leaf views of one qkv [S, 3, H, D]), cos, sin [S, R] (fp32, or bf16 for the
    bf16-tables variant), and the upstream gradients gq, gk [S, H, D] in `layout`."""
    import torch

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dt)

    q, k, _ = rnd(S, 3, H, D).unbind(1)
    freqs = rnd(S, rotated(D, variant) // 2, dt=torch.float32)
    # as the models build their tables: cat(freqs, freqs), or each angle twice for pairs
    emb = freqs.repeat_interleave(2, dim=1) if variant == "interleaved" else freqs.repeat(1, 2)
    table_dtype = torch.bfloat16 if variant == "bf16-tables" else torch.float32
    if layout == "sdpa":
        gq, gk = (rnd(1, H, S, D).transpose(1, 2)[0] for _ in range(2))
    else:
        gq, gk = rnd(S, H, D), rnd(S, H, D)
    cos, sin = emb.cos().to(table_dtype), emb.sin().to(table_dtype)
    return {"q": q.requires_grad_(), "k": k.requires_grad_(), "cos": cos, "sin": sin, "gq": gq, "gk": gk}


def make_decoder_inputs(B, S, HQ, HK, D, dtype, layout, device, generator):
    """The decoders' call: q [B, HQ, S, D], k [B, HK, S, D] (leaf views of the projections
    [B, S, H*D]), cos, sin [B, S, D] in `dtype` (of cat(freqs, freqs)), the upstream gradients
    gq, gk [B, H, S, D] in `layout` (sdpa: contiguous; flash: [B, S, H, D] transposed)."""
    import torch

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dt)

    def heads(H, grad=False):
        if grad and layout == "sdpa":
            return rnd(B, H, S, D)
        return rnd(B, S, H * D).view(B, S, H, D).transpose(1, 2)

    freqs = rnd(B, S, D // 2, dt=torch.float32)
    emb = torch.cat((freqs, freqs), dim=-1)
    q, k = heads(HQ).requires_grad_(), heads(HK).requires_grad_()
    return {"q": q, "k": k, "cos": emb.cos().to(dtype), "sin": emb.sin().to(dtype), "gq": heads(HQ, True),
            "gk": heads(HK, True)}  # fmt: skip


def make_family_inputs(name, B, S, dtype, device, generator):
    """A FAMILY_CALLS family's call: q [B, HQ, S, D] and k [B, HK, S, D] (leaf views of the
    projections), its tables in `dtype` ([B, S, width], DINOv3's [S - prefix, width]), and the
    upstream gradients [B, H, S, D] (sdpa's)."""
    import torch

    _, HQ, HK, D, width, prefix = FAMILY_CALLS[name]

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dt)

    q, k = (rnd(B, S, H * D).view(B, S, H, D).transpose(1, 2).requires_grad_() for H in (HQ, HK))
    angles = rnd(S - prefix, width, dt=torch.float32) if prefix else rnd(B, S, width, dt=torch.float32)
    return {"q": q, "k": k, "cos": angles.cos().to(dtype), "sin": angles.sin().to(dtype), "gq": rnd(B, HQ, S, D),
            "gk": rnd(B, HK, S, D)}  # fmt: skip


def family_functions(kernel, name):
    """(ours, transformers') fn(q, k, cos, sin) -> (q_embed, k_embed) of a FAMILY_CALLS family: ours
    the package's layer of the family's variant, a function of one tensor called for each."""
    from .models import modeling_module, plain_function

    own = plain_function(modeling_module(FAMILY_CALLS[name][0]).apply_rotary_pos_emb)
    layer = getattr(kernel.layers, kernel.variants.classify(own).layer_name)()
    if FAMILY_CALLS[name][0] == "deepseek_v4":
        return tuple((lambda f: lambda q, k, c, s: (f(q, c, s), f(k, c, s)))(f) for f in (layer, own))
    return layer, own


def family_reference(x, own, rows, S):
    """(q_embed, k_embed, dq, dk) on token rows (pick_rows) by float64 autograd of the family's own
    function, on the inputs' device."""
    import torch

    leaves = [x[n].detach().double().requires_grad_() for n in ("q", "k")]
    outs = own(*leaves, x["cos"].double(), x["sin"].double())
    grads = torch.autograd.grad(outs, leaves, [x["gq"].double(), x["gk"].double()])
    return [pick_rows(t.detach(), rows, S).cpu() for t in (*outs, *grads)]


def private_copy(x):
    """The inputs again, in buffers of their own with the same strides: for an implementation that
    writes into its inputs (Liger-Kernel rotates q, k and the gradient in place where their
    storage is [B, S, H, D])."""
    import torch

    def copy(t):
        out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device).copy_(t.detach())
        return out.requires_grad_(t.requires_grad)

    return {name: copy(t) for name, t in x.items()}


def rotated(D, variant):
    """The rotated channels: all but 2 of each head for partial rotary (minimax_m3_vl: 78 of 80)."""
    return D - 2 if variant == "partial" else D


def floor_bytes(x):
    """Bytes the call on inputs `x` must move: forward reads q, k, cos, sin and writes q_embed,
    k_embed (each as large as its input: the outputs come in q's dtype, which the decoders'
    promotion with cos's keeps here); backward reads gq, gk, cos, sin and writes dq, dk."""

    def size(*names):
        return sum(x[n].numel() * x[n].element_size() for n in names)

    return {"fwd": 2 * size("q", "k") + size("cos", "sin"), "bwd": 2 * size("gq", "gk") + size("cos", "sin")}


class FwdBwd:
    """One real call of `fn` (q, k, cos, sin) -> (q_embed, k_embed): forward, then the
    gradients of q and k; keeps the latest (q_embed, k_embed, dq, dk)."""

    def __init__(self, fn, x, backward=True):
        self.fn, self.x, self.backward, self.last = fn, x, backward, ()

    def __call__(self):
        import torch

        x = self.x
        with torch.set_grad_enabled(self.backward):  # without: a decoding step, its outputs alone
            out = self.last = self.fn(x["q"], x["k"], x["cos"], x["sin"])
        if not self.backward:
            return
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


# The call's function in ours and in Liger-Kernel, by whether the call is the decoders'
OURS = {False: "apply_rotary_pos_emb_vision", True: "apply_rotary_pos_emb"}
LIGER = {False: "liger_rotary_pos_emb_vision", True: "liger_rotary_pos_emb"}


def transformers_fn(decoder=False):
    from .models import decoder_rotary, modeling_module

    return decoder_rotary() if decoder else modeling_module().apply_rotary_pos_emb_vision


def implementations(kernel, others, peers, variant="halves", decoder=False):
    """name -> (label, fn(q, k, cos, sin) -> (q_embed, k_embed)) of the implementations to time;
    `others`: other builds of ours (A/B), named ab, ab2, ... The peers serve the halves alone;
    decoder: the decoders' call (halves)."""
    import functools

    def ours(k):
        fn = getattr(k, OURS[decoder])
        return functools.partial(fn, interleaved=True) if variant == "interleaved" else fn

    impls = {"ours": ("ours", ours(kernel))}
    for i, other in enumerate(others):
        # builds from before the interleaved and partial forms serve the others alone, and
        # builds from before the decoders' function the vision call alone
        if hasattr(other, OURS[decoder]) and (variant in ("halves", "bf16-tables") or supports_variants(other)):
            impls[ab_name(i)] = (f"A/B: {other.__name__}", ours(other))
    if variant not in ("halves", "bf16-tables"):
        return impls
    if "compile" in peers:
        from .peers import compiled

        impls["compile"] = ("torch.compile(transformers)", compiled(transformers_fn(decoder)))
    if "liger" in peers:
        try:
            from liger_kernel.transformers import rope as liger
        except ImportError:
            liger = None
        if liger is not None:
            impls["liger"] = ("Liger-Kernel", getattr(liger, LIGER[decoder]))
        else:
            print("realcall: liger-kernel is not installed, so Liger-Kernel is not timed", file=sys.stderr)
    if "transformers" in peers:
        impls["transformers"] = ("transformers (eager)", transformers_fn(decoder))
    return impls


def supports_variants(build) -> bool:
    """Whether a build of ours takes interleaved pairs and partial tables (both came together)."""
    import inspect

    return "interleaved" in inspect.signature(build.apply_rotary_pos_emb_vision).parameters


def pick_rows(t, rows, S=None):
    """The token `rows` of t: rows of [S, ...]; with S (a decoder's sequence length), row b*S + s of
    [B, H, S, D] (t[b, :, s]: [rows, H, D]) or of a table [B, S, R] or [1, S, R]."""
    rows = rows.to(t.device)
    if S is None:
        return t[rows]
    b, s = rows // S, rows % S
    return t[b, :, s] if t.dim() == 4 else t[b % t.shape[0], s]


def reference(x, rows, interleaved=False, S=None):
    """(q_embed, k_embed, dq, dk) on token rows (pick_rows) by float64 autograd of the math."""
    import torch

    picked = {n: pick_rows(t.detach(), rows, S).cpu().double() for n, t in x.items()}
    leaves = [picked[n].requires_grad_() for n in ("q", "k")]
    outs = suite.reference_vision_forward(*leaves, picked["cos"], picked["sin"], interleaved)
    return (*outs, *torch.autograd.grad(outs, leaves, [picked["gq"], picked["gk"]]))


def workloads(args):
    """(variant, dtype, (model, HQ, HK, D), layout, B, S) of the run; model and B are None for the
    vision call ([S, H, D] tensors, HQ = HK = --heads)."""
    if args.preset == "families":
        work = QUICK_FAMILY_WORKLOADS if args.quick else FAMILY_WORKLOADS
        return [("halves", dt, (name, *FAMILY_CALLS[name][1:4]), "sdpa", B, S) for dt in args.dtypes
                for name, B, S in work if name in args.models]  # fmt: skip
    if args.preset in ("decoder", "decode"):
        from .models import decoder_shapes

        shapes = [(name, *decoder_shapes()[name]) for name in args.models]
        batches = args.batches
    else:
        shapes = [(None, args.heads, args.heads, D) for D in args.head_dims]
        batches = [None]
    return [
        (v, dt, shape, lay, B, S)
        for v in args.variants or ["halves"]
        for dt in args.dtypes
        for shape in shapes
        for lay in args.layouts
        for B in batches
        for S in args.seq_lens
        if args.preset != "decode" or S == 1 or B == 1  # decode: a prefill at B = 1
    ]


def measure(args, kernel, others=()) -> dict:
    """The run `args` (bench's resolved arguments) ask for, of the loaded package `kernel` and
    of other builds of it (`others`, --ab)."""
    import torch
    from tqdm import tqdm

    from .hosttime import per_call_us
    from .models import sync
    from .output import run_meta
    from .timing import ColdL2Timer

    device = torch.device(args.device)
    timer = ColdL2Timer(device, calls=args.calls, primary=args.timer)
    decoder, step = args.preset in ("decoder", "decode", "families"), args.preset == "decode"
    variants = args.variants or ["halves"]
    impls = {v: implementations(kernel, others, set(args.peers), v, decoder) for v in variants}
    families = {name: family_functions(kernel, name) for name in args.models} if args.preset == "families" else {}
    todo = workloads(args)
    shape = dict(models=args.models, batches=args.batches) if decoder else dict(heads=args.heads)
    meta = run_meta(device, kernel=kernel, timer=timer, rounds=args.rounds, ab=[str(p) for p in args.ab or ()],
                    preset=args.preset, **shape)  # fmt: skip
    rows_out = []
    n_runs = sum(len(impls[w[0]]) + ("copy" in args.peers) for w in todo)
    with tqdm(total=n_runs, desc=args.preset, unit="run", file=sys.stderr) as bar:
        for variant, dtype_name, (model, H, HK, D), layout, B, S in todo:
            dtype = getattr(torch, dtype_name)
            gen = torch.Generator().manual_seed(args.seed * 1_000_003 + S * 1009 + D + 31 * (B or 0))
            if model in families:
                x = make_family_inputs(model, B, S, dtype, device, gen)
            elif decoder:
                x = make_decoder_inputs(B, S, H, HK, D, dtype, layout, device, gen)
            else:
                x = make_inputs(S, H, D, dtype, layout, device, gen, variant)
            rows = suite.verify_rows(S * (B or 1), args.verify_tokens, args.seed + S)
            if model in families:
                refs = family_reference(x, families[model][1], rows, S)
            else:
                refs = reference(x, rows, variant == "interleaved", S if decoder else None)
            nbytes = floor_bytes(x)
            entry = {"variant": variant, "dtype": dtype_name, "D": D, "layout": layout, "S": S, "H": H}
            if decoder:
                entry.update(model=model, HK=HK, B=B)
            entry.update(bytes=sum(nbytes.values()), results={})
            fns = {n: fn for n, (_, fn) in impls[variant].items()}
            if model in families:  # the family's own function, and torch.compile of it
                ours, own = families[model]
                fns = {"ours": ours} | {n: own if n == "transformers" else compiled_family(model, own) for n in fns
                                        if n in ("compile", "transformers")}  # fmt: skip
            calls = {name: FwdBwd(fn, private_copy(x) if name == "liger" else x, not step)
                     for name, fn in fns.items()}  # fmt: skip
            if "copy" in args.peers:
                calls["copy"] = Copies(nbytes, device)
            checks, outcome = {}, {}  # outcome: the exception a call raised, else its Stats
            every_row = torch.arange(len(rows))
            for name, call in calls.items():
                bar.set_postfix_str(f"{workload_name(entry)} {name}")
                try:
                    call()
                    if name == "copy":
                        checks[name] = {"ok": call.ok()}
                    else:
                        picked = [pick_rows(t, rows, S if decoder else None) for t in call.last]
                        checks[name] = suite.judge(picked, refs, dtype_name, every_row)
                except Exception as exc:  # a failing peer must not cost the whole run
                    outcome[name] = exc
            bar.set_postfix_str(f"{workload_name(entry)} timing")
            # ours, the A/B builds and the peers in turns
            outcome |= timer.in_rounds({n: c for n, c in calls.items() if n in checks}, args.rounds)
            if step:  # host-bound: back to back, as generation calls it
                walls = per_call_us({n: c for n, c in calls.items() if n in checks}, n=5 * args.calls,
                                    rounds=args.rounds, sync=lambda: sync(device))  # fmt: skip
            for name in calls:
                out = outcome[name]
                if isinstance(out, Exception):
                    entry["results"][name] = {"error": f"{type(out).__name__}: {out}"}
                    bar.write(f"  {name} {workload_name(entry)}: {entry['results'][name]['error']}")
                else:
                    entry["results"][name] = {"time": out.as_dict(), "verify": checks[name]}
                    if step:
                        entry["results"][name]["time"]["wall_us"] = walls[name][0]  # median pass
                    if not checks[name]["ok"]:
                        bar.write(f"  {name} {workload_name(entry)}: verification FAILED {checks[name]}")
                bar.update()
            rows_out.append(entry)
            del x, calls
            if device.type == "cuda":
                torch.cuda.empty_cache()
    labels = {name: label for v in variants for name, (label, _) in impls[v].items()}
    if "copy" in args.peers:
        labels["copy"] = "copy of the same bytes (2 launches)"
    return {"meta": meta, "labels": labels, "workloads": rows_out}


_COMPILED = {}


def compiled_family(name, own):
    """torch.compile of a family's function, once per family."""
    if name not in _COMPILED:
        from .peers import compiled

        _COMPILED[name] = compiled(own)
    return _COMPILED[name]


def _us(entry, name, figure="mean_us"):
    r = entry["results"].get(name, {})
    return r["time"].get(figure) if "time" in r else None


def render_markdown(runs) -> str:
    return "\n".join(_markdown(run) for run in runs)


def _ratio(name) -> str:
    """The ratio column of `name`: ours over the references (the copy, other builds of ours), each
    peer over ours."""
    return f"ours / {name}" if name == "copy" or name.startswith("ab") else f"{name} / ours"


def _keys(w) -> tuple:
    """(header, row) of the columns that name workload w."""
    if "model" in w:
        return ["model", "heads", "B", "dtype", "grad layout", "S"], [
            w["model"], f"{w['H']}/{w['HK']} x {w['D']}", w["B"], w["dtype"], w["layout"], w["S"]
        ]  # fmt: skip
    return ["variant", "dtype", "D", "grad layout", "S"], [w.get("variant", "halves"), w["dtype"], w["D"], w["layout"],
                                                          w["S"]]  # fmt: skip


def _markdown(run) -> str:
    meta, labels = run["meta"], run["labels"]
    names = [n for n in labels if n != "ours"]
    figures = {"mean_us": "us", "wall_us": "wall us"} if meta.get("preset") == "decode" else {"mean_us": "us"}
    header = _keys(run["workloads"][0])[0] + [f"ours {f}" for f in figures.values()] if run["workloads"] else []
    for n, f in ((n, f) for n in names for f in figures.values()):
        header += [f"{labels[n]} {f}", _ratio(n)]
    rows = []
    for w in run["workloads"]:
        row = _keys(w)[1] + [f"{t:.1f}" if (t := _us(w, "ours", f)) else "—" for f in figures]
        for n, f in ((n, f) for n in names for f in figures):
            t, ours = _us(w, n, f), _us(w, "ours", f)
            ratio = (ours / t if _ratio(n).startswith("ours") else t / ours) if t and ours else None
            row += [f"{t:.1f}" if t else "—", f"{ratio:.3f}" if ratio else "—"]
        rows.append(row)
    fails = suite.failures([run], workload_name, prefixes=("",))  # every implementation
    gpu = meta.get("gpu") or f"{meta['device']} ({meta.get('note', '')})"
    if meta.get("preset") == "decode":
        call = ("Decode step (the decoders' call, forward only under no grad: q/k views of the projections, cos/sin "
                "[B, S, D] in q's dtype); us: GPU, wall us: per call in a loop")  # fmt: skip
    elif meta.get("preset") == "families":
        call = ("Families' own calls (GPT-OSS: a table value per pair; DeepSeek-V4: one tensor, a rope slice at "
                "the end of each head; DINOv3: prefix tokens passed through; q/k views of the projections, forward "
                "+ backward of q and k), against their own function eager and compiled")  # fmt: skip
    elif "models" in meta:
        call = ("Decoder call (q/k views of the q and k projections, cos/sin [B, S, D] in q's dtype without "
                "gradient, forward + backward of q and k)")  # fmt: skip
    else:
        call = (f"Real call (q/k views of one qkv, cos/sin without gradient, forward + backward of q and k), "
                f"{meta['heads']} heads")  # fmt: skip
    verified = "all passed." if not fails else "FAILED: " + "; ".join(fails)
    lines = [f"{call}; {gpu}; {meta['timer']}; mean of {meta['calls']} calls{output.in_rounds(meta)}; torch "
             f"{meta['versions']['torch']}, triton {meta['versions']['triton']}; {meta['date']}.  ",
             f"Command: `{meta['command']}`", "", output.markdown_table(header, rows), "",
             f"Verification (float64, before timing): {verified}"]  # fmt: skip
    ratios = [_us(w, "ours") / _us(w, "copy") for w in run["workloads"] if _us(w, "ours") and _us(w, "copy")]
    if ratios:
        lines.append(
            f"Ours / copy: geometric mean {statistics.geometric_mean(ratios):.3f}, "
            f"range {min(ratios):.3f}-{max(ratios):.3f}."
        )
    return "\n".join(lines) + "\n"


def render_plot(runs, path) -> bool:
    """ours / copy against S per dtype, head_dim and layout; False where matplotlib is missing."""
    plt = output.pyplot("bench", path)
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, run in enumerate(runs):
        for key in sorted({_curve(w) for w in run["workloads"]}):
            ws = sorted((w for w in run["workloads"] if _curve(w) == key), key=lambda w: w["S"])
            pts = [(w["S"], _us(w, "ours") / _us(w, "copy")) for w in ws if _us(w, "ours") and _us(w, "copy")]
            if pts:
                run_label = f"run {i + 1}: " if len(runs) > 1 else ""
                ax.plot(*zip(*pts), "-o", ms=3, label=run_label + " ".join(map(str, key)))
    ax.axhline(1.0, color="k", ls="--", lw=1, label="copy of the same bytes")
    ax.set(xscale="log", xlabel="S (tokens)", ylabel="ours / copy (time)",
           title=f"real call, forward + backward, {runs[0]['meta'].get('gpu') or 'CPU (meaningless)'}")  # fmt: skip
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    output.save_figure(fig, path)
    return True


def _curve(w):
    if "model" in w:
        return (w["model"], f"B={w['B']}", w["dtype"], w["layout"])
    return (w.get("variant", "halves"), w["dtype"], f"D={w['D']}", w["layout"])


def workload_name(w) -> str:
    return " ".join(map(str, _curve(w))) + f" S={w['S']}"
