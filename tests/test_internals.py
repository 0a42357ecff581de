"""The private parts of kernels and transformers that internals.py names still exist in the
installed releases: each test fails with the part's name. scripts/against.sh runs them with the
oldest and newest releases the README supports, hub CI (no transformers) the kernels ones."""

import inspect
import pickle

import pytest
import torch
from kernels import Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping, use_kernelized_func


def _rotary(q, k, cos, sin):
    return q * cos + k * sin, k


def _need(cond, part):
    assert cond, f"internals.py: {part} is missing or changed in this release; the package relies on it"


@pytest.fixture(scope="module")
def layer():
    return use_kernel_forward_from_hub("ApplyRotaryPosEmbVision")(_rotary)


@pytest.mark.kernels_ci
def test_kernels_layer_of_a_function(kernel, layer):
    internals = kernel.internals
    _need(internals.layer_name(layer) == "ApplyRotaryPosEmbVision", f"kernels' `{internals.LAYER_NAME}` of a layer")
    _need(
        internals.kernels_function(type(layer)) is _rotary, "kernels' function in its layer's forward closure (`func`)"
    )


class _Attention(torch.nn.Module):
    def forward(self, x):
        return x


@pytest.mark.kernels_ci
def test_kernels_kernel_funcs(kernel, layer):
    internals = kernel.internals
    module = use_kernelized_func(layer)(_Attention)()
    funcs = internals.kernel_funcs(module)
    _need(list(funcs) == ["ApplyRotaryPosEmbVision"], f"kernels' `{internals.KERNEL_FUNCS}` in a module's __dict__")
    _need(type(next(iter(funcs.values()))) is type(layer), f"kernels' entries of `{internals.KERNEL_FUNCS}`")
    internals.drop_kernel_funcs(module, {type(layer)})
    assert internals.KERNEL_FUNCS not in vars(module)


@pytest.mark.kernels_ci
def test_kernels_kernel_repo(kernel, layer):
    internals = kernel.internals
    module = use_kernelized_func(layer)(type("Attention", (_Attention,), {}))()
    with use_kernel_mapping(kernel.kernel_mapping()):
        kernelize(module, mode=Mode.INFERENCE, device="cpu")
    entry = next(iter(internals.kernel_funcs(module).values()))
    _need(internals.kernel_repo(entry) is not None, f"kernels' `{internals.KERNEL_REPO}` of a kernelized entry")


def test_transformers_kernel_config(kernel):
    internals = kernel.internals
    from transformers import KernelConfig

    for name in ("store_registered_layer_names", "sanitize_kernel_mapping", "create_compatible_mapping"):
        _need(callable(getattr(KernelConfig, name, None)), f"transformers' KernelConfig.{name}")
    params = list(inspect.signature(KernelConfig.create_compatible_mapping).parameters)
    _need(
        params[:3] == ["self", "model", "compile"],
        "transformers' KernelConfig.create_compatible_mapping(model, compile)",
    )
    config = internals.RotaryKernelConfig({}, {}, print)
    for name in ("registered_layer_names", "kernel_mapping", "use_local_kernel", "inherit_mapping"):
        _need(hasattr(config, name), f"transformers' KernelConfig().{name}")
    assert isinstance(config, KernelConfig) and type(pickle.loads(pickle.dumps(config))) is type(config)


def test_transformers_model_kernels_state():
    import transformers
    from packaging.version import Version
    from transformers import LlamaConfig, LlamaModel, PreTrainedModel

    _need(callable(getattr(PreTrainedModel, "set_use_kernels", None)), "transformers' PreTrainedModel.set_use_kernels")
    if Version(transformers.__version__) >= Version("5.25"):  # 5.24 has no kernels_mode: read as None
        _need(isinstance(getattr(PreTrainedModel, "kernels_mode", None), property), "PreTrainedModel.kernels_mode")
    tiny = LlamaConfig(hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2, vocab_size=8)
    model = LlamaModel(tiny)
    _need("kernel_config" in vars(model), "transformers' PreTrainedModel.kernel_config")
    _need("kernel_config" in inspect.signature(model.set_use_kernels).parameters, "set_use_kernels(kernel_config=)")
