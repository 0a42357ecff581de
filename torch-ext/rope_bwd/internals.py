"""The private parts of kernels and transformers the package relies on, in one place. Each says
what for; all were checked on kernels 0.18.3 and 0.19.1 with transformers 5.24 and 5.25, and
tests/test_internals.py fails naming the part when a release drops one. (torch's and Triton's
private launcher: fast_launch.py.) kernels and transformers are imported inside the calls.
"""

# kernels' use_kernelized_func: a module's functions, {layer name: kernels layer}, in its __dict__
# (kernels has no public call for a module built before its class was decorated, nor a view).
KERNEL_FUNCS = "_kernel_funcs"
# kernels.kernelize: the repository it gave an entry, in the entry's __dict__ (absent: the function).
KERNEL_REPO = "_kernel_repo"
# kernels' use_kernel_forward_from_hub: the layer name, on the class it makes (transformers reads it too).
LAYER_NAME = "kernel_layer_name"


def kernel_funcs(module, create=False) -> dict:
    """The module's own {layer name: entry} of kernels' use_kernelized_func ({} if none)."""
    return module.__dict__.setdefault(KERNEL_FUNCS, {}) if create else module.__dict__.get(KERNEL_FUNCS, {})


def drop_kernel_funcs(module, types) -> None:
    """Takes the entries of these types back from the module (the attribute too, once empty)."""
    funcs = kernel_funcs(module)
    for name in [n for n, f in funcs.items() if type(f) in types]:
        del funcs[name]
    if KERNEL_FUNCS in module.__dict__ and not funcs:
        del module.__dict__[KERNEL_FUNCS]


def kernel_repo(entry):
    """The repository kernelize gave an entry of kernel_funcs, or None."""
    return entry.__dict__.get(KERNEL_REPO)


def layer_name(function):
    """The layer name kernels' use_kernel_forward_from_hub gave a function (or its class), or None."""
    return getattr(function, LAYER_NAME, None)


def kernels_function(layer_type):
    """The function that `layer_type`, the class kernels' use_kernel_forward_from_hub makes of a
    function, wraps; None for any other class. kernels keeps it only in the closure of that class's
    forward (`func`), and a layer kernelize gives such a module must know the function it replaces:
    kernels maps layer names, and transformers gives functions of several variants one name."""
    forward = getattr(layer_type, "forward", None)
    code = getattr(forward, "__code__", None)
    if code is None or "func" not in code.co_freevars or forward.__closure__ is None:
        return None
    function = forward.__closure__[code.co_freevars.index("func")].cell_contents
    return function if callable(function) else None


def kernels_mode(model):
    """transformers' PreTrainedModel.kernels_mode, the mode it last kernelized in (None: reset); from
    5.25 on (5.24 has none: None, and the watch then tells a change by train()/eval() alone)."""
    return getattr(model, "kernels_mode", None)


def keep_mapping(model, mapping) -> None:
    """`mapping` into the `kernel_config` of each transformers PreTrainedModel in `model` (those
    with `set_use_kernels`), over its own entries, its flags kept: transformers kernelizes such a
    model again at every change between train() and eval(), that config over its own mapping."""
    from transformers import KernelConfig

    for sub in model.modules():
        if not hasattr(sub, "set_use_kernels"):
            continue
        own = getattr(sub, "kernel_config", None)
        if own is None:
            sub.kernel_config = KernelConfig(kernel_mapping=dict(mapping))
        else:
            flags = {"use_local_kernel": own.use_local_kernel, "inherit_mapping": own.inherit_mapping}
            sub.kernel_config = KernelConfig(kernel_mapping=own.kernel_mapping | mapping, **flags)


def __getattr__(name):
    """RotaryKernelConfig, made at its first use (transformers imported then), found by pickle."""
    if name != "RotaryKernelConfig":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from transformers import KernelConfig

    class RotaryKernelConfig(KernelConfig):
        """A KernelConfig naming the package's layers, for `from_pretrained(..., kernel_config=...)`.
        Of transformers' steps, the check of its entries against the layer names the model registers
        (sanitize_kernel_mapping, from store_registered_layer_names) keeps those entries, and the
        mapping for the mode loaded in, accelerators only (create_compatible_mapping), is the
        package's: every mode on CUDA and CPU (transformers' would send `rotary_pos_emb` to a kernel
        without a backward), followed by `on_mapped(model)`."""

        def __init__(self, entries, mapping, on_mapped):
            super().__init__(kernel_mapping=entries)  # {layer name: ("repo:layer", {version, trust_remote_code})}
            self.rotary_mapping, self.on_mapped = mapping, on_mapped

        def sanitize_kernel_mapping(self, model):
            self.store_registered_layer_names(model)
            registered = set(self.registered_layer_names.values())
            self.kernel_mapping = {name: entry for name, entry in self.kernel_mapping.items() if name in registered}
            super().sanitize_kernel_mapping(model)

        def create_compatible_mapping(self, model, compile=False):
            self.kernel_mapping = {name: self.rotary_mapping[name] for name in self.kernel_mapping}
            self.on_mapped(model)

    RotaryKernelConfig.__qualname__ = name
    globals()[name] = RotaryKernelConfig
    return RotaryKernelConfig
