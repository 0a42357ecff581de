"""Kernelize transformers' vision rotary by kernel name.

transformers defines the vision rotary of Qwen3-Omni, Qwen2.5-VL and Qwen3-VL as a
plain module-level function, `apply_rotary_pos_emb_vision(q, k, cos, sin)`, that
the vision attention's forward calls as a global. `kernels.kernelize` only sees
layers, so `make_kernelizable` turns that function into one with the kernels
library's own mechanisms:

1. the function becomes an instance of `_TransformersRotary`, an nn.Module made
   extensible under the kernel layer name "ApplyRotaryPosEmbVision" by
   `kernels.replace_kernel_forward_from_hub` (what `use_kernel_forward_from_hub` does
   to a function, minus its local class, which pickle cannot find);
2. the modeling module's global is rebound to that instance, so the attention
   forward calls it;
3. it is added to the `_kernel_funcs` of the attention modules, as
   `kernels.use_kernelized_func` does: through the attention class's constructor
   (models built later) and directly (models passed in), so that `kernelize` visits it.

Then the standard flow applies: a kernel mapping for "ApplyRotaryPosEmbVision"
(`kernel_mapping`) and `kernels.kernelize(model, mode=..., device=...)`.
`kernelize_vision_rotary` does all of it for one model.

One layer per modeling module: kernelize replaces the `forward` of that shared
instance, so every model of a family in the process follows the last kernelize
call that reached it (all models of that family run the kernel, or all the
original). The kernel's ops dispatch on the tensors' device, so one kernelized
instance serves CPU and CUDA models alike. `restore_transformers` puts the
original functions back.

Pickling: the layer is a patch of the process, not state of a model. A model pickles
(torch.save) without it, kernelized or restored, and loads in any process, without
this package: it calls transformers' function there, until it is kernelized again.

`kernels` and `transformers` are imported inside the functions: the package
itself needs only torch.
"""

import copy
import functools
import importlib
import inspect
import os
import pkgutil

from torch import nn

LAYER_NAME = "ApplyRotaryPosEmbVision"
REPO_ID = "rope-bwd/rope-bwd"
SUPPORTED_FAMILIES = ("qwen3_omni_moe", "qwen2_5_vl", "qwen3_vl")
_FUNC_NAME = "apply_rotary_pos_emb_vision"
_SIGNATURE = ("q", "k", "cos", "sin")

# family -> (modeling module, original function, layer, {attention class: original __init__ or None})
_PATCHED: dict = {}


def _modeling_module(family: str):
    if family not in SUPPORTED_FAMILIES:
        raise ValueError(f"family must be one of {SUPPORTED_FAMILIES}, got {family!r}")
    return importlib.import_module(f"transformers.models.{family}.modeling_{family}")


def _attention_classes(module) -> list:
    """Classes of `module` whose forward calls the module's global rotary function
    (found from the bytecode's global names, so no class name is hard-coded)."""
    from torch import nn

    def calls_rotary(cls):
        code = getattr(inspect.unwrap(cls.forward), "__code__", None)
        return code is not None and _FUNC_NAME in code.co_names

    return [
        cls
        for cls in vars(module).values()
        if inspect.isclass(cls)
        and issubclass(cls, nn.Module)
        and cls.__module__ == module.__name__
        and calls_rotary(cls)
    ]


class _TransformersRotary(nn.Module):
    """transformers' `apply_rotary_pos_emb_vision` of one family as a kernelizable layer.
    One instance per family, the module global: pickled, it is that global by name (on
    loading, transformers' function, or this process's layer while patched); deep-copied,
    itself (what a copied model's attention calls)."""

    def __init__(self, module_name: str, function):
        super().__init__()
        self.module_name, self.function = module_name, function

    def forward(self, q, k, cos, sin):
        return self.function(q, k, cos, sin)

    def __reduce__(self):
        return pkgutil.resolve_name, (f"{self.module_name}:{_FUNC_NAME}",)

    def __deepcopy__(self, memo):
        return self


class _KernelFuncs(dict):
    """The `_kernel_funcs` of an attention module, holding our layer: pickled, a plain dict
    without it (a loaded model needs neither this package nor the patch, and kernelize
    finds no stale layer there); copied, with it."""

    def __reduce__(self):
        return dict, ([(k, v) for k, v in self.items() if not isinstance(v, _TransformersRotary)],)

    def __copy__(self):
        return _KernelFuncs(self)

    def __deepcopy__(self, memo):
        return _KernelFuncs({k: copy.deepcopy(v, memo) for k, v in self.items()})


def _attach(module, layer):
    """Put `layer` in module._kernel_funcs, where kernelize looks (kernels.use_kernelized_func's key)."""
    funcs = module.__dict__.get("_kernel_funcs")
    if not isinstance(funcs, _KernelFuncs):
        funcs = module.__dict__["_kernel_funcs"] = _KernelFuncs(funcs or {})
    funcs[LAYER_NAME] = layer


def _attach_on_init(cls, layer):
    """Attach `layer` to every instance of `cls` built from now on."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _attach(self, layer)

    cls.__init__ = __init__


def _patch(family: str):
    if family in _PATCHED:
        return _PATCHED[family]
    import kernels

    module = _modeling_module(family)
    original = getattr(module, _FUNC_NAME)
    params = tuple(inspect.signature(original).parameters)
    if params != _SIGNATURE:
        raise TypeError(f"{module.__name__}.{_FUNC_NAME} takes {params}, expected {_SIGNATURE}")
    classes = _attention_classes(module)
    if not classes:
        raise TypeError(f"no class of {module.__name__} calls {_FUNC_NAME}")

    kernels.replace_kernel_forward_from_hub(_TransformersRotary, LAYER_NAME)
    layer = _TransformersRotary(module.__name__, original)
    inits = {cls: cls.__dict__.get("__init__") for cls in classes}
    for cls in classes:
        _attach_on_init(cls, layer)
    setattr(module, _FUNC_NAME, layer)
    _PATCHED[family] = (module, original, layer, inits)
    return _PATCHED[family]


def make_kernelizable(*models, families=SUPPORTED_FAMILIES) -> None:
    """Make transformers' `apply_rotary_pos_emb_vision` of `families` a kernelizable
    layer named "ApplyRotaryPosEmbVision" (idempotent). Models built before the call
    are passed as `models`; models built after it need nothing."""
    patched = [_patch(f) for f in families]
    attached = {cls: layer for _, _, layer, inits in patched for cls in inits}
    for model in models:
        for sub in model.modules():
            layer = attached.get(type(sub))
            if layer is not None:
                _attach(sub, layer)


def restore_transformers() -> None:
    """Undo make_kernelizable: original functions and attention constructors back.
    Models built while patched keep the layer in their `_kernel_funcs` (not pickled);
    their forward calls the original function again."""
    for module, original, _, inits in _PATCHED.values():
        setattr(module, _FUNC_NAME, original)
        for cls, init in inits.items():
            if init is None:
                delattr(cls, "__init__")
            else:
                cls.__init__ = init
    _PATCHED.clear()


def kernel_mapping(repo_id: str = REPO_ID, *, version: int = 1, trust_remote_code=True) -> dict:
    """The mapping for `kernels.register_kernel_mapping` / `use_kernel_mapping`: the
    layer "ApplyRotaryPosEmbVision" of `repo_id` for CUDA and CPU, in every mode
    (it has a backward and compiles without graph breaks).

    When LOCAL_KERNELS names `repo_id` (a checkout, or hub CI's build), the layer comes
    from there through kernels' LocalLayerRepository, as get_kernel's lookup does: a
    LayerRepository would resolve `version` on the Hub first. Otherwise, with
    HF_HUB_OFFLINE=1, kernels resolves `version` from its cache.

    trust_remote_code defaults to True because this code already comes from that
    repository; pass False (or a list) to have kernels check the publisher again."""
    from kernels import LayerRepository, LocalLayerRepository, Mode

    local = _local_kernel_path(repo_id)
    if local is not None:
        repo = LocalLayerRepository(local, layer_name=LAYER_NAME)
    else:
        repo = LayerRepository(repo_id, layer_name=LAYER_NAME, version=version, trust_remote_code=trust_remote_code)
    modes = [Mode.INFERENCE, Mode.TRAINING, Mode.INFERENCE | Mode.TORCH_COMPILE, Mode.TRAINING | Mode.TORCH_COMPILE]
    return {LAYER_NAME: {device: {mode: repo for mode in modes} for device in ("cuda", "cpu")}}


def _local_kernel_path(repo_id: str):
    """Where LOCAL_KERNELS points `repo_id`, or None; read by the parser get_kernel uses."""
    spec = os.environ.get("LOCAL_KERNELS")
    if not spec:
        return None
    from kernels.load import _parse_local_kernel_overrides

    return _parse_local_kernel_overrides(spec).get(repo_id)


def _families_in(model) -> list:
    names = {type(sub).__module__ for sub in model.modules()}
    return [f for f in SUPPORTED_FAMILIES if f"transformers.models.{f}.modeling_{f}" in names]


def kernelize_vision_rotary(model, *, mode, device=None, repo_id: str = REPO_ID, version: int = 1, **kernelize_kwargs):
    """make_kernelizable for the families found in `model`, then `kernels.kernelize`
    under `kernel_mapping(repo_id, version=version)` (added to any mapping already
    registered). Returns the model, as kernelize does."""
    import kernels

    families = _families_in(model)
    if not families:
        raise ValueError(f"the model has no module of the supported families {SUPPORTED_FAMILIES}")
    make_kernelizable(model, families=families)
    with kernels.use_kernel_mapping(kernel_mapping(repo_id, version=version)):
        return kernels.kernelize(model, mode=mode, device=device, **kernelize_kwargs)
