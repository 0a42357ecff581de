"""The classification table: what each transformers rotary function computes (`Variant`), and
`classify`, which finds a function's variant by evaluating it on small random probes against
rotary_torch. A variant is:
- the form, told by the parameters: `apply_rotary_pos_emb_vision(q, k, cos, sin)` (vision),
  `apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)` (decoder), `apply_rotary_pos_emb(x,
  cos, sin, unsqueeze_dim=1)` (single: Gemma 4, DeepSeek-V4), or DINOv3's `apply_rotary_pos_emb(q,
  k, cos, sin, **kwargs)` (prefix: the tables cover the patch tokens, those before pass through);
- the pairs: halves (rotate_half), interleaved (rotate_pairwise), or interleaved from a table
  whose first half holds one value per pair (GLM: `cos[..., :R/2].repeat_interleave(2)`);
- the table: a value per rotated channel, or one per pair (GPT-OSS, DeepSeek-V4);
- the channels rotated: the first (the rest pass through), or the last (DeepSeek-V4);
- the dtype rule: each output in its input's dtype, in its promotion with cos and sin, or in q's.
"""

import inspect
from typing import NamedTuple

import torch
from torch import nn

from . import rotary_torch

PARAMS = {
    "vision": ("q", "k", "cos", "sin"),
    "decoder": ("q", "k", "cos", "sin", "unsqueeze_dim"),
    "single": ("x", "cos", "sin", "unsqueeze_dim"),
    "prefix": ("q", "k", "cos", "sin", "kwargs"),
}
FUNCTIONS = {form: "apply_rotary_pos_emb" + ("_vision" if form == "vision" else "") for form in PARAMS}
_STEMS = {form: "ApplyRotaryPosEmb" + ("" if form == "decoder" else form.title()) for form in PARAMS}
_PAIRS = {"halves": "", "interleaved": "Interleaved", "repeated": "RepeatedPairs"}
_DTYPES = {"kept": "", "promoted": "Promoted", "q": "InQDtype"}


class Variant(NamedTuple):
    """What a family's rotary computes (see the module's docstring)."""

    form: str  # "vision", "decoder", "single" or "prefix"
    pairs: str  # "halves", "interleaved" or "repeated"
    dtypes: str  # "kept", "promoted" or "q"
    table: str = "channel"  # a value per rotated "channel", or per "pair"
    rotated: str = "first"  # the "first" or the "last" channels

    @property
    def layer_name(self) -> str:
        """The layer's class in layers.py, also its layer name for kernels."""
        extra = ("PairTable" if self.table == "pair" else "") + ("Last" if self.rotated == "last" else "")
        return _STEMS[self.form] + _PAIRS[self.pairs] + extra + _DTYPES[self.dtypes]

    @property
    def flags(self) -> int:
        """rotary_torch's `pairs` flags of the rotation (a repeated table is read as a value per pair)."""
        return (
            (rotary_torch.INTERLEAVED if self.pairs != "halves" else 0)
            | (rotary_torch.PAIR_TABLE if self.table == "pair" or self.pairs == "repeated" else 0)
            | (rotary_torch.LAST if self.rotated == "last" else 0)
        )


# In the order classification prefers them where its probes cannot tell (dtypes kept first).
VARIANTS = (
    *(
        Variant(form, pairs, dtypes)
        for form in ("vision", "decoder", "single")
        for pairs in _PAIRS
        for dtypes in _DTYPES
        if not (form == "single" and dtypes == "q")  # one tensor: q's dtype is its own
    ),
    Variant("decoder", "halves", "promoted", table="pair"),  # GPT-OSS
    Variant("decoder", "interleaved", "promoted", table="pair"),  # OpenAI's privacy filter
    Variant("single", "interleaved", "kept", table="pair", rotated="last"),  # DeepSeek-V4
    Variant("prefix", "halves", "promoted"),  # DINOv3
)
VARIANTS_TEXT = (
    "rotate_half, rotate_pairwise or pairs of a repeated table over the first cos.shape[-1] channels, the rest "
    "passed through; GPT-OSS's and DeepSeek-V4's tables of one value per pair; DINOv3's prefix tokens; each output "
    "in its input's dtype, in its promotion with cos and sin, or in q's"
)

# The probes: S tokens, HQ/HK heads of D channels; R rotated in the partial case, R/2 odd (as
# MiniMax-M3's 78 of 80) so that no halves/pairs layout coincides with another. float64 probes
# tell the rotation by values and gradients; the mixed dtypes, on which the two dtype rules
# disagree, tell the rule. Tables of D/2 and R/2 channels: one value per pair, or partial rotary.
_S, _HQ, _HK, _D, _R = 5, 2, 3, 16, 10
_DTYPES_PROBED = (  # (q, k, cos and sin)
    (torch.float64,) * 3,
    (torch.bfloat16, torch.float32, torch.float32),
    (torch.float32, torch.bfloat16, torch.bfloat16),
    (torch.bfloat16,) * 3,
)
_DECODER_PROBES = (  # q/k passed as [B, H, S, D], the tables [B, S, R] or shared [1, S, R]
    *(((2, _S), (2,), width, d) for width in (_D, _D // 2) for d in _DTYPES_PROBED),
    ((2, _S), (1,), _D, _DTYPES_PROBED[0]),
    *(((2, _S), (2,), width, _DTYPES_PROBED[0]) for width in (_R, _R // 2)),
)
_PROBES = {  # form -> (leading dims of q and k as [..., S, H, D], of the tables, table width, dtypes, table tokens)
    "vision": (
        *(((_S,), (), _D, d) for d in _DTYPES_PROBED),
        *(((2, _S), (), _D, d) for d in _DTYPES_PROBED),
        ((_S,), (), _R, _DTYPES_PROBED[0]),
    ),
    "decoder": _DECODER_PROBES,
    "single": _DECODER_PROBES,  # called for q alone
    "prefix": (  # q/k passed as [B, H, S, D], the tables [S - 2, R] (two prefix tokens) or [S, R]
        *(((2, _S), (), _D, d, _S - 2) for d in _DTYPES_PROBED),
        ((2, _S), (), _D, _DTYPES_PROBED[0], _S),
    ),
}
_TOL_FLOAT64 = 1e-4  # most families compute in float32 even on float64 inputs
_TOL_BF16 = 3e-2  # a few bf16 roundings (2^-9 each) of the largest value
_CLASSIFIED: dict = {}  # function -> Variant


def _probe_inputs(gen, lead, table_lead, rot, dtypes, table_tokens=_S):
    def rnd(*shape, dtype):
        return torch.randn(*shape, generator=gen, dtype=torch.float64, device="cpu").to(dtype)

    q, k = rnd(*lead, _HQ, _D, dtype=dtypes[0]), rnd(*lead, _HK, _D, dtype=dtypes[1])
    tables = [rnd(*table_lead, table_tokens, rot, dtype=dtypes[2]) for _ in range(2)]
    return q, k, *tables


def _heads_first(form, x):
    """q or k as a function of `form` takes it, from [..., S, H, D], and back."""
    return x if form == "vision" else x.transpose(-3, -2)


def _max_err(outs, refs) -> float:
    """Largest |out - ref| over the outputs, relative to their largest |ref|; a missing
    output (an unused gradient) counts as zeros."""
    err = max((r.double() if o is None else o.double() - r.double()).abs().max().item() for o, r in zip(outs, refs))
    return err / max(max(r.abs().max().item() for r in refs), 1e-30)


def _call(fn, form, args):
    """fn's outputs as [..., S, H, D] (q's alone for a function of one tensor), None when it
    raises (a call its model never makes), or a ValueError's text when they are not tensors
    shaped like q and k."""
    q, k, cos, sin = args
    q, k = _heads_first(form, q), _heads_first(form, k)
    want = [q] if form == "single" else [q, k]
    try:
        outs = fn(q, cos, sin) if form == "single" else fn(q, k, cos, sin)
    except Exception:
        return None
    outs = [outs] if form == "single" and isinstance(outs, torch.Tensor) else outs
    tensors = isinstance(outs, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in outs)
    if not (tensors and len(outs) == len(want)):
        return f"returned {type(outs).__name__}, not {'x_embed' if form == 'single' else '(q_embed, k_embed)'}"
    if [tuple(o.shape) for o in outs] != [tuple(x.shape) for x in want]:
        return f"returned shapes {[tuple(o.shape) for o in outs]}, not those of its inputs"
    return [_heads_first(form, o) for o in outs]


def _mismatch(variant, args, outs, cot, grads) -> str:
    """How `outs` (and, on float64 probes, the gradients `grads` of cotangents `cot`) differ from
    rotary_torch's float64 values of the variant on `args`; "" when they do not, None where the
    variant takes no such tables (a width past head_dim, an odd one for pairs of channels)."""
    q, k, cos, _ = args
    rule = {"kept": lambda x: x.dtype, "promoted": lambda x: torch.promote_types(x.dtype, cos.dtype)}
    want = tuple(q.dtype if variant.dtypes == "q" else rule[variant.dtypes](x) for x in (q, k))[: len(outs)]
    got = tuple(o.dtype for o in outs)
    if got != want:
        return f"outputs in {', '.join(map(str, got))}, not {', '.join(map(str, want))}"
    exact = q.dtype == torch.float64
    ref_args = [a.detach().double().requires_grad_(exact) for a in args]
    tables = ref_args[2:]
    if variant.pairs == "repeated":
        tables = [t[..., : t.shape[-1] // 2] for t in tables]
    width = tables[0].shape[-1]
    if rotary_torch.rotated_channels(tables[0], variant.flags) > _D or (variant.table == "channel" and width % 2):
        return None
    refs = rotary_torch.forward(*ref_args[:2], *tables, pairs=variant.flags)[: len(outs)]
    errs = [_max_err(outs, refs)]
    if exact:
        ref_grads = torch.autograd.grad(refs, ref_args, cot, allow_unused=True)
        errs += [_max_err([g], [r]) for g, r in zip(grads, ref_grads) if r is not None]
    err = max(errs)
    return "" if err <= (_TOL_FLOAT64 if exact else _TOL_BF16) else f"relative error {err:.2g} in values or gradients"


def classify(function, name: str = None) -> Variant:
    """The variant (VARIANTS) that `function`, a transformers rotary function of one of the forms,
    computes: every probe it does not raise on must match the variant's values, gradients (float64)
    and output dtypes, and it must run a probe whose table covers all of head_dim. The first that
    matches (dtypes kept where no probe tells the rule); else a ValueError naming `name`, saying
    what differed."""
    if function in _CLASSIFIED:
        return _CLASSIFIED[function]
    name = name or getattr(function, "__qualname__", repr(function))
    prefix = f"{name} matches none of the supported rotary variants ({VARIANTS_TEXT})"
    try:  # the parameter names of the function, or of a kernels layer's forward
        params = tuple(inspect.signature(function.forward if isinstance(function, nn.Module) else function).parameters)
    except (TypeError, ValueError):
        params = None
    form = next((f for f, p in PARAMS.items() if p == params), None)
    if form is None:
        raise ValueError(f"{prefix}: it takes {params}, not {' or '.join(map(str, dict.fromkeys(PARAMS.values())))}")
    gen = torch.Generator().manual_seed(0)
    why = {v: "" for v in VARIANTS if v.form == form}  # variant -> the first probe it failed, and how
    checked = set()  # the variants some probe the function ran on was checked against
    ran_full = False
    for probe in _PROBES[form]:
        args = _probe_inputs(gen, *probe)
        dtypes, rot = probe[3], probe[2]
        x_shape = list(_heads_first(form, args[0]).shape)
        what = f"q {x_shape} {dtypes[0]}, k {dtypes[1]}, cos/sin {list(args[2].shape)} {dtypes[2]}"
        exact = dtypes[0] == torch.float64
        outs = _call(function, form, [a.requires_grad_(exact) for a in args])
        if isinstance(outs, str) or (exact and outs is not None and not all(o.requires_grad for o in outs)):
            raise ValueError(f"{prefix}: {what}: {outs or 'its outputs carry no gradient'}")
        if outs is None:
            continue
        ran_full |= rot in (_D, _D // 2)
        cot = grads = None
        if exact:
            cot = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outs]
            grads = torch.autograd.grad(outs, args, cot, allow_unused=True)
        for variant in [v for v, w in why.items() if not w]:
            mismatch = _mismatch(variant, args, outs, cot, grads)
            if mismatch is not None:
                checked.add(variant)
                why[variant] = mismatch and f"{what}: {mismatch}"
    if not ran_full:
        raise ValueError(f"{prefix}: it raised on every probe that rotates all of head_dim")
    variant = next((v for v, w in why.items() if not w and v in checked), None)
    if variant is None:
        reasons = set(why.values())
        why = {v: w or "no probe it ran has tables of this variant's form" for v, w in why.items()}
        text = reasons.pop() if len(reasons) == 1 else "; ".join(f"as {v.layer_name}, {w}" for v, w in why.items())
        raise ValueError(f"{prefix}: {text}")
    _CLASSIFIED[function] = variant
    return variant
