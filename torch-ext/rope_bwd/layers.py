"""Layers for kernels.kernelize: one per variant of transformers' rotary functions (`VARIANTS`,
the classification table integrations.py matches each family's function against):

- the form: the vision encoders' `apply_rotary_pos_emb_vision(q, k, cos, sin)`, the decoders'
  `apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`, or a decoder's function of one
  tensor, `apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1)` (Gemma 4, called for q and k);
- the pairs: halves (rotate_half), interleaved (rotate_pairwise), or interleaved from a table
  whose first half holds one value per pair (GLM: `cos[..., :R/2].repeat_interleave(2)`); over
  the first cos.shape[-1] channels, the rest passed through;
- the dtype rule: each output in its input's dtype, in its promotion with cos and sin (a function
  computing in its inputs' dtypes), or both in q's.

Stateless classes, made from the table: kernels accepts no members but forward (and its two
flags), and checks that forward's parameters are those of the function it replaces, so the
variant is the class, held by forward's closure.
"""

from typing import NamedTuple

from torch import nn

from .ops import heads_axis, rotary_call

FUNCTIONS = {
    "vision": "apply_rotary_pos_emb_vision",
    "decoder": "apply_rotary_pos_emb",
    "single": "apply_rotary_pos_emb",
}
PARAMS = {
    "vision": ("q", "k", "cos", "sin"),
    "decoder": ("q", "k", "cos", "sin", "unsqueeze_dim"),
    "single": ("x", "cos", "sin", "unsqueeze_dim"),
}
_STEMS = {"vision": "ApplyRotaryPosEmbVision", "decoder": "ApplyRotaryPosEmb", "single": "ApplyRotaryPosEmbSingle"}
_PAIRS = {"halves": "", "interleaved": "Interleaved", "repeated": "RepeatedPairs"}
_DTYPES = {"kept": "", "promoted": "Promoted", "q": "InQDtype"}


class Variant(NamedTuple):
    """What a family's rotary computes (see the module's docstring)."""

    form: str  # "vision", "decoder" or "single"
    pairs: str  # "halves", "interleaved" or "repeated"
    dtypes: str  # "kept", "promoted" or "q"

    @property
    def layer_name(self) -> str:
        """The layer's class here, also its layer name for kernels."""
        return _STEMS[self.form] + _PAIRS[self.pairs] + _DTYPES[self.dtypes]


# In the order classification prefers them where its probes cannot tell (dtypes kept first).
VARIANTS = tuple(
    Variant(form, pairs, dtypes)
    for form in _STEMS
    for pairs in _PAIRS
    for dtypes in _DTYPES
    if not (form == "single" and dtypes == "q")  # one tensor: q's dtype is its own
)


def _forward(v: Variant):
    fn, kw = FUNCTIONS[v.form], {"pairs": v.pairs, "dtypes": v.dtypes}
    if v.form == "vision":

        def forward(self, q, k, cos, sin):
            return rotary_call(fn, q, k, cos, sin, **kw)

    elif v.form == "decoder":

        def forward(self, q, k, cos, sin, unsqueeze_dim=1):
            return rotary_call(fn, q, k, cos, sin, heads_axis=heads_axis(fn, unsqueeze_dim), **kw)

    else:

        def forward(self, x, cos, sin, unsqueeze_dim=1):
            return rotary_call(fn, x, None, cos, sin, heads_axis=heads_axis(fn, unsqueeze_dim), **kw)

    forward.__qualname__ = f"{v.layer_name}.forward"  # found by name, as pickle looks for it
    return forward


def _layer(v: Variant) -> type:
    doc = f"transformers' {FUNCTIONS[v.form]}{PARAMS[v.form]}: {v.pairs} pairs, dtypes {v.dtypes}."
    attrs = {"__doc__": doc, "__module__": __name__, "forward": _forward(v), "can_torch_compile": True}
    return type(v.layer_name, (nn.Module,), attrs | {"has_backward": True})


LAYERS = {v: _layer(v) for v in VARIANTS}
globals().update({cls.__name__: cls for cls in LAYERS.values()})  # layers.<name>, where kernels looks
