"""Layers for kernels.kernelize, one per variant (variants.py): stateless classes (kernels accepts
no members but forward and its two flags, and checks forward's parameters against the function's),
the variant held by forward's closure.

kernels maps a layer name to a layer, never a family: a layer may be given a function of another
variant (transformers marks GPT-OSS's function with Llama's "rotary_pos_emb"). So each forward
first asks which variant the function it replaces computes (`serving`, once per function) and
runs that layer, or transformers' function, with one warning naming the family and the reason.
"""

import warnings

from torch import nn

from . import internals
from .ops import heads_axis, rotary_call
from .variants import FUNCTIONS, PARAMS, VARIANTS, Variant, classify


def _layer(v: Variant) -> type:
    fn = FUNCTIONS[v.form]
    kw = {"pairs": v.flags, "repeated": v.pairs == "repeated", "dtypes": v.dtypes}
    if v.form == "vision":

        def forward(self, q, k, cos, sin):
            if (served := _SERVING.get(type(self)) or serving(self) or v) is not v:
                return _serve(served, self, q, k, cos, sin)
            return rotary_call(fn, q, k, cos, sin, **kw)

    elif v.form == "decoder":

        def forward(self, q, k, cos, sin, unsqueeze_dim=1):
            if (served := _SERVING.get(type(self)) or serving(self) or v) is not v:
                return _serve(served, self, q, k, cos, sin, unsqueeze_dim)
            return rotary_call(fn, q, k, cos, sin, heads_axis=heads_axis(fn, unsqueeze_dim), **kw)

    elif v.form == "single":

        def forward(self, x, cos, sin, unsqueeze_dim=1):
            if (served := _SERVING.get(type(self)) or serving(self) or v) is not v:
                return _serve(served, self, x, cos, sin, unsqueeze_dim)
            return rotary_call(fn, x, None, cos, sin, heads_axis=heads_axis(fn, unsqueeze_dim), **kw)

    else:

        def forward(self, q, k, cos, sin, **kwargs):
            if (served := _SERVING.get(type(self)) or serving(self) or v) is not v:
                return _serve(served, self, q, k, cos, sin, **kwargs)
            return rotary_call(fn, q, k, cos, sin, heads_axis=-3, prefix=True, **kw)

    forward.__qualname__ = f"{v.layer_name}.forward"  # found by name, as pickle looks for it
    doc = f"transformers' {fn}{PARAMS[v.form]}: {v.layer_name}'s variant, {tuple(v)}."
    attrs = {"__doc__": doc, "__module__": __name__, "forward": forward, "can_torch_compile": True}
    return type(v.layer_name, (nn.Module,), attrs | {"has_backward": True})


LAYERS = {v: _layer(v) for v in VARIANTS}
globals().update({cls.__name__: cls for cls in LAYERS.values()})  # layers.<name>, where kernels looks


class Unsupported:
    """What serves a function none of the variants: the function, with a warning at its first call."""

    def __init__(self, function, reason):
        self.function, self.reason, self.warned = function, reason, False

    def __call__(self, *args, **kwargs):
        if not self.warned:
            self.warned = True
            warnings.warn(f"rope-bwd: transformers' own function runs: {self.reason}", stacklevel=3)
        return self.function(*args, **kwargs)


_SERVING = {cls: v for v, cls in LAYERS.items()}  # module type -> its Variant, or Unsupported


def serving(module):
    """What serves the function `module` (a kernels layer of a function) stands for: its Variant,
    classified once, or Unsupported; a module wrapping no function, its own layer's variant."""
    served = _SERVING.get(type(module))
    if served is None:
        function = internals.kernels_function(type(module))
        if function is None:
            return next((v for v, cls in LAYERS.items() if isinstance(module, cls)), None)
        name = f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', function)}"
        served = _SERVING[type(module)] = classified(function, name)
    return served


def classified(function, name):
    """The Variant of `function` (classify), or Unsupported with classify's reason."""
    try:
        return classify(function, name)
    except ValueError as e:
        return Unsupported(function, str(e))


def _serve(served, module, *args, **kwargs):
    """Runs a rotary function with the layer of its own variant, or transformers' function."""
    if isinstance(served, Variant):
        return LAYERS[served].forward(module, *args, **kwargs)
    return served(*args, **kwargs)
