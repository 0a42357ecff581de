"""Kernelize transformers' rotary functions (the vision encoders' `apply_rotary_pos_emb_vision`,
the decoders' `apply_rotary_pos_emb`) by kernel name: `make_kernelizable` makes each family's
function a kernels layer named after its variant (`classify`), `kernel_mapping` maps those names and
transformers' own hook "rotary_pos_emb" to this repository, `kernelize_rotary` does both and
kernelizes a model. Families are found at run time in transformers' sources. kernels and
transformers are imported inside the functions.
"""

import functools
import importlib
import inspect
import os
import sys
import warnings
import weakref
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from . import internals, layers
from .variants import VARIANTS, Variant, classify

REPO_ID = "rope-bwd/rope-bwd"
HOOK = "rotary_pos_emb"  # transformers' own layer name for the decoders' Llama-like rotary
NAMES = ("apply_rotary_pos_emb_vision", "apply_rotary_pos_emb")  # the module globals patched
LAYER_NAMES = tuple(v.layer_name for v in VARIANTS)
LAYER_NAME = VARIANTS[0].layer_name  # the vision variant of most families (halves, dtypes kept)
HOOK_VARIANT = Variant("decoder", "halves", "promoted")  # Llama's body: what transformers' hook name stands for
MAPPED = {name: name for name in LAYER_NAMES} | {HOOK: HOOK_VARIANT.layer_name}  # layer name -> the package's layer


class _Patch(NamedTuple):
    module: object  # the modeling module
    name: str  # the function's name there
    original: object  # its function (transformers' kernels layer, for a function it marks)
    function: object  # the module global while patched
    classes: dict  # attention class -> its own (__init__, forward) before the patch, None if untouched
    layer_name: str  # the layer name the function had (marked by transformers), or None


_PATCHED: dict = {}  # (family, function name) -> _Patch
_HOLDERS = weakref.WeakSet()  # modules holding an entry make_kernelizable attached (restore takes it back)


def find_families(name: str = None) -> tuple:
    """The families of the installed transformers whose modeling module's source names a rotary
    function (`name`, one of NAMES, or any); candidates, classified when patched."""
    import transformers.models

    found = _found(tuple(transformers.models.__path__))
    return found[name] if name is not None else tuple(sorted(set().union(*found.values())))


@functools.cache
def _found(paths) -> dict:
    """{function name: families} of the modeling modules under transformers.models' paths."""
    found = {n: [] for n in NAMES}
    for p in paths:
        for d in sorted(Path(p).iterdir()):
            path = d / f"modeling_{d.name}.py"
            source = path.read_bytes() if path.is_file() else b""
            for n in NAMES:
                if f"{n}(".encode() in source:
                    found[n].append(d.name)
    return {n: tuple(families) for n, families in found.items()}


def _modeling_module(family: str):
    """The modeling module of `family`, imported; a ValueError when it defines no rotary."""
    name = f"transformers.models.{family}.modeling_{family}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if not name.startswith(str(e.name)):
            raise  # a dependency the module needs, not the family
        raise ValueError(
            f"transformers has no family {family!r} ({name} not found); families with a rotary: "
            f"{', '.join(find_families())}"
        ) from None
    if not any(hasattr(module, n) for n in NAMES):
        raise ValueError(f"{name} has no {' or '.join(NAMES)}")
    return module


def _calls(cls, name: str) -> bool:
    code = getattr(inspect.unwrap(getattr(cls, "forward", None)), "__code__", None)
    return code is not None and name in code.co_names


def _attention_classes(module, name: str) -> list:
    """Classes of `module` whose forward calls its global function `name` (read from bytecode)."""
    classes = [c for c in vars(module).values() if inspect.isclass(c) and issubclass(c, nn.Module)]
    return [c for c in classes if c.__module__ == module.__name__ and _calls(c, name)]


def _functions(module):
    """(name, function, attention classes) of each rotary function of `module` that a class calls."""
    for name in NAMES:
        function, classes = getattr(module, name, None), _attention_classes(module, name)
        if function is not None and classes:
            yield name, function, classes


def families_in(*models) -> list:
    """The families whose rotary some module of `models` calls, in order of appearance."""
    families = []
    for cls in dict.fromkeys(type(m) for model in models for m in model.modules()):
        parts = cls.__module__.split(".")  # transformers.models.<family>.modeling_<family>
        if len(parts) != 4 or parts[:2] != ["transformers", "models"] or parts[3] != f"modeling_{parts[2]}":
            continue
        module = sys.modules.get(cls.__module__)
        if parts[2] not in families and any(hasattr(module, n) and _calls(cls, n) for n in NAMES):
            families.append(parts[2])
    return families


# ------------------------------------------------------------------- patching


def _attach(module, function):
    """Give a module built before its class was decorated the entry of `function` that kernels'
    use_kernelized_func gives those it builds: copied from a throwaway module of such a class."""
    import kernels

    made = kernels.use_kernelized_func(function)(type("_Attached", (nn.Module,), {}))()
    funcs = internals.kernel_funcs(module, create=True)
    for name, entry in internals.kernel_funcs(made).items():
        funcs.setdefault(name, entry)
    _HOLDERS.add(module)


def _track(cls, function):
    """A class decorated by use_kernelized_func: the modules it builds are recorded (restore_transformers
    takes their entry back); one built before the decoration, not passed to make_kernelizable, gets
    its entry at its first call (and runs transformers' function until kernelized)."""
    init, decorated = cls.__init__, cls.forward
    name = internals.layer_name(function)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _HOLDERS.add(self)

    @functools.wraps(decorated)
    def forward(self, *args, **kwargs):
        if not torch.compiler.is_compiling() and name not in internals.kernel_funcs(self):
            _attach(self, function)
        return decorated(self, *args, **kwargs)

    cls.__init__, cls.forward = __init__, forward


def kernelized_layers(model, *, others=False) -> list:
    """What kernelize made of `model`'s rotaries: for each function that kernels attached to one of
    its modules, the name of the package's layer it runs, or None where it runs transformers' own
    (others=True: the repository of another kernel it runs, rather than None)."""
    names = {cls.forward: v.layer_name for v, cls in layers.LAYERS.items()}
    funcs = [f for m in model.modules() for f in internals.kernel_funcs(m).values()]
    runs = [names.get(getattr(getattr(f, "forward", None), "__func__", None)) for f in funcs]
    if others:
        runs = [r or internals.kernel_repo(f) for r, f in zip(runs, funcs)]
    return runs


def _plan(family: str) -> list:
    """[(module, name, original, variant, attention classes)] of `family`'s rotary functions,
    classified, nothing patched; a ValueError when one cannot be patched."""
    module = _modeling_module(family)
    plans = [(module, n, f, classify(f, f"{module.__name__}.{n}"), classes) for n, f, classes in _functions(module)]
    if not plans:
        raise ValueError(f"no class of {module.__name__} calls its rotary function")
    return plans


def _patch(family: str, plan) -> None:
    """Make the family's function a kernelizable layer under its variant's layer name: a function
    transformers marks itself ("rotary_pos_emb") keeps its layer class and attention classes,
    renamed when it is not Llama's variant; any other is decorated, its attention classes with it."""
    import kernels

    module, name_in_module, original, variant, classes = plan
    name = HOOK if variant == HOOK_VARIANT else variant.layer_name
    marked = internals.layer_name(original)
    if marked is not None:
        kernels.replace_kernel_forward_from_hub(type(original), name)
        function, saved = original, {}
    else:
        function = kernels.use_kernel_forward_from_hub(name)(original)
        saved = {cls: (cls.__dict__.get("__init__"), cls.__dict__.get("forward")) for cls in classes}
        for cls in classes:
            kernels.use_kernelized_func(function)(cls)
            _track(cls, function)
        setattr(module, name_in_module, function)
    _PATCHED[family, name_in_module] = _Patch(module, name_in_module, original, function, saved, marked)
    layers._SERVING[type(function)] = variant  # known before a traced first call


def make_kernelizable(*models, families=None) -> list:
    """Make transformers' rotary functions of `families` kernelizable layers under the layer name
    of their variant (idempotent); returns the families patched.

    families: names (`find_families()`); by default those of `models`, or, without models, every
    family of the installed transformers (those none of the variants are left, with a warning). A
    named family, or one of `models`, that cannot be patched is a ValueError, nothing patched.
    Models built before the call are passed as `models`; those built after it need nothing."""
    if families is None and models:
        families = families_in(*models)
        if not families:
            raise ValueError(f"no module of the models calls a transformers {' or '.join(NAMES)}")
    done = {family for family, _ in _PATCHED}
    if families is None:
        plans, skipped = {}, []
        for family in find_families():
            if family not in done:
                try:
                    plans[family] = _plan(family)
                except (ValueError, ImportError) as e:  # ImportError: a dependency only that family needs
                    skipped.append(f"{family}: {e}")
        if skipped:
            warnings.warn("left as transformers has them:\n" + "\n".join(skipped), stacklevel=2)
    else:
        families = [families] if isinstance(families, str) else list(families)
        plans = {f: _plan(f) for f in dict.fromkeys(families) if f not in done}
    for family, family_plans in plans.items():
        for plan in family_plans:
            _patch(family, plan)
    if families is None:
        families = list(dict.fromkeys(family for family, _ in _PATCHED))
    functions = {cls: p.function for p in _PATCHED.values() for cls in _attention_classes(p.module, p.name)}
    for model in models:
        for sub in model.modules():
            if type(sub) in functions:
                _attach(sub, functions[type(sub)])
    return families


def restore_transformers() -> None:
    """Undo make_kernelizable: original functions, layer names and attention classes back, and the
    entries it attached taken back from the modules holding them, so that they run and pickle as
    transformers' own. Models kernelize_rotary watched lose the watch."""
    import kernels

    ours = {type(p.function) for p in _PATCHED.values() if p.classes}  # the entries of decorated functions
    for module in list(_HOLDERS):
        internals.drop_kernel_funcs(module, ours)
    _HOLDERS.clear()
    for watch in list(_WATCHED.values()):
        watch.handle.remove()
    _WATCHED.clear()
    for patch in _PATCHED.values():
        if patch.layer_name is not None:
            kernels.replace_kernel_forward_from_hub(type(patch.original), patch.layer_name)
        setattr(patch.module, patch.name, patch.original)
        for cls, own in patch.classes.items():
            for attr, value in zip(("__init__", "forward"), own):
                setattr(cls, attr, value) if value is not None else delattr(cls, attr)
    _PATCHED.clear()


def kernel_mapping(repo_id: str = REPO_ID, *, version: int = 1, trust_remote_code=True) -> dict:
    """The mapping for `kernels.register_kernel_mapping` / `use_kernel_mapping`: every name of
    `LAYER_NAMES`, and transformers' own "rotary_pos_emb" (Llama's variant), from `repo_id`, for
    CUDA and CPU, in every mode (the layers have a backward and compile without graph breaks).
    It reaches the functions transformers marks "rotary_pos_emb" and those make_kernelizable marked;
    each layer runs the variant of the function it replaces (layers.py), or transformers' function
    with a warning (GPT-OSS's carries Llama's name): `check_rotaries(model)` says which, up front.

    When LOCAL_KERNELS names `repo_id` (a checkout, hub CI's build), the layers come from there
    through kernels' LocalLayerRepository, as get_kernel's lookup does (a LayerRepository would
    resolve `version` on the Hub, or offline in kernels' cache). trust_remote_code defaults to True,
    this code coming from that repository; pass False (or a list) to have kernels check it again."""
    from kernels import LayerRepository, LocalLayerRepository, Mode

    # LOCAL_KERNELS (`repo_id=path:repo_id=path`) parsed here: kernels' own parser is private and
    # moved between its releases
    entries = (e.split("=", 1) for e in os.environ.get("LOCAL_KERNELS", "").split(":") if "=" in e)
    local = {repo: Path(path) for repo, path in entries}.get(repo_id)

    def repo(name):
        if local is not None:
            return LocalLayerRepository(local, layer_name=name)
        return LayerRepository(repo_id, layer_name=name, version=version, trust_remote_code=trust_remote_code)

    modes = [Mode.INFERENCE, Mode.TRAINING, Mode.INFERENCE | Mode.TORCH_COMPILE, Mode.TRAINING | Mode.TORCH_COMPILE]
    repos = {key: repo(name) for key, name in MAPPED.items()}
    return {key: {device: dict.fromkeys(modes, r) for device in ("cuda", "cpu")} for key, r in repos.items()}


def kernelize_rotary(model, *, mode, device=None, repo_id: str = REPO_ID, version: int = 1, **kernelize_kwargs):
    """make_kernelizable(model) (a ValueError, nothing patched, where it has no family or one that is
    none of the variants), then `kernels.kernelize` under `kernel_mapping(repo_id, version=version)`,
    added to any registered mapping; returns the model, as kernelize does. The mapping also goes into
    its transformers models' `kernel_config`: they keep the layers when transformers kernelizes them
    again (at each train()/eval() change of a model loaded with its kernels on). Should another
    kernelization take them away (reset_kernels(), kernels_mode=None, another kernel_config), the
    model's next forward says so, once."""
    import kernels

    make_kernelizable(model)
    mapping = kernel_mapping(repo_id, version=version)
    internals.keep_mapping(model, mapping)
    with kernels.use_kernel_mapping(mapping):
        model = kernels.kernelize(model, mode=mode, device=device, **kernelize_kwargs)
    _watch(model)
    return model


def check_rotaries(model) -> dict:
    """What runs each rotary function `model`'s attention modules call, by "<family>.<function>":
    the package's layer of the function's variant, or, where it is none, the reason transformers'
    own function runs (with a warning). The layers make this choice at their first call, whatever
    route mapped them; made up front, a first call traced by torch.compile finds it made."""
    found = {}
    for family in families_in(model):
        module = _modeling_module(family)
        for name, function, _ in _functions(module):
            layer = isinstance(function, nn.Module)  # a kernels layer of the function
            served = layers.serving(function) if layer else layers.classified(function, f"{module.__name__}.{name}")
            found[f"{family}.{name}"] = served.layer_name if isinstance(served, Variant) else served.reason
            if not isinstance(served, Variant):
                warnings.warn(f"rope-bwd: transformers' own function runs: {served.reason}", stacklevel=2)
    return found


kernelize_vision_rotary = kernelize_rotary  # version 1's first name, when it served the vision encoders alone


def kernel_config(*families, repo_id: str = REPO_ID, version: int = 1):
    """For `from_pretrained(..., kernel_config=...)`: make_kernelizable(families=...) (by default
    every family of the installed transformers), so that the model built next registers the
    layer names, then a transformers KernelConfig naming the package's layers. Unlike one written
    by hand (mapped for inference and accelerators only), it maps every mode on CUDA and CPU."""
    make_kernelizable(families=list(families) or None)
    options = {"version": version, "trust_remote_code": True}
    entries = {name: (f"{repo_id}:{layer}", dict(options)) for name, layer in MAPPED.items()}
    return internals.RotaryKernelConfig(entries, kernel_mapping(repo_id, version=version), _watch)


# ------------------------------------------------------------------ transformers' kernel management


class _Watch(NamedTuple):
    handle: object  # the forward pre-hook's
    seen: list  # [the model's (training, kernels_mode) last checked, whether it warned]


_WATCHED = weakref.WeakKeyDictionary()  # model -> _Watch


def _watch(model) -> None:
    """A forward pre-hook on `model` that, at its first forward after a change of mode, checks that
    every rotary it holds still runs the package's layers, and warns once where one does not."""
    if model not in _WATCHED:
        _WATCHED[model] = _Watch(model.register_forward_pre_hook(_check_kept), [None, False])


def _check_kept(model, args) -> None:
    watch = _WATCHED.get(model)
    if watch is None or torch.compiler.is_compiling():
        return
    state = (model.training, internals.kernels_mode(model))
    if watch.seen[0] == state or watch.seen[1]:
        return
    watch.seen[0] = state
    runs = kernelized_layers(model, others=True)
    lost = sorted({r for r in runs if r not in LAYER_NAMES}, key=str)
    if lost:
        watch.seen[1] = True
        what = " and ".join("transformers' own function" if r is None else f"the layer of {r}" for r in lost)
        warnings.warn(
            f"rope-bwd: {sum(r not in LAYER_NAMES for r in runs)} of the {len(runs)} rotaries of "
            f"{type(model).__name__} run {what}, not this package's layers: a kernelization after "
            f"kernelize_rotary took them away (transformers' reset_kernels(), kernels_mode=None, "
            f"another kernel_config). kernelize_rotary(model, mode=...) puts them back.",
            stacklevel=2,
        )
