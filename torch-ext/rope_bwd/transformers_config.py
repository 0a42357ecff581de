"""transformers' KernelConfig for the package's layers (integrations.kernel_config makes it).
Imported only by that call: the package itself needs neither transformers nor kernels."""

from transformers import KernelConfig


class RotaryKernelConfig(KernelConfig):
    """A KernelConfig naming the package's layers, for `from_pretrained(..., kernel_config=...)`.

    transformers checks a config against the layer names the model registers, then turns its
    `{layer name: "repo:layer"}` entries into a kernels mapping for the device and mode the model
    is loaded in (inference; accelerators only), and kernelizes with it again at each later
    train()/eval(). Here the check keeps the entries the model registers, and the mapping is the
    package's own, every mode on CUDA and CPU: training keeps the layers (with transformers' own
    mapping its `rotary_pos_emb` would go to a kernel without a backward)."""

    def __init__(self, entries, mapping):
        super().__init__(kernel_mapping=entries)  # {layer name: ("repo:layer", {version, trust_remote_code})}
        self.rotary_mapping = mapping  # the package's kernel_mapping()

    def sanitize_kernel_mapping(self, model):
        self.store_registered_layer_names(model)
        registered = set(self.registered_layer_names.values())
        self.kernel_mapping = {name: entry for name, entry in self.kernel_mapping.items() if name in registered}
        super().sanitize_kernel_mapping(model)

    def create_compatible_mapping(self, model, compile=False):
        from . import integrations

        self.kernel_mapping = {name: self.rotary_mapping[name] for name in self.kernel_mapping}
        integrations._watch(model)
