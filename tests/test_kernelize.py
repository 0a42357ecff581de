"""kernels.kernelize with the package's mapping, as a user of the kernels library writes it:
a module whose layer name is "ApplyRotaryPosEmbVision" gets the package's layer.

These need no transformers (hub CI's environment has none; tests/toolkit/ kernelizes
transformers' vision encoders). The mapping comes from the build LOCAL_KERNELS names,
through kernels' LocalLayerRepository: no version is resolved on the Hub, and every test
runs with the network refused (tests/offline.py).
"""

import os
from pathlib import Path

import pytest
import torch
from kernels import (
    LayerRepository,
    LocalLayerRepository,
    Mode,
    kernelize,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)

from . import reference
from .helpers import REPO_ID

ALL_MODES = {Mode.INFERENCE, Mode.TRAINING, Mode.INFERENCE | Mode.TORCH_COMPILE, Mode.TRAINING | Mode.TORCH_COMPILE}


@use_kernel_forward_from_hub("ApplyRotaryPosEmbVision")
class Rotary(torch.nn.Module):
    """A model's own rotary, in float32; kernelize swaps in the package's layer."""

    def forward(self, q, k, cos, sin):
        return reference.reference_vision_forward(q, k, cos, sin)


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rotary = Rotary()

    def forward(self, q, k, cos, sin):
        return self.rotary(q, k, cos, sin)


def _local_path() -> Path:
    return Path(dict(e.split("=", 1) for e in os.environ["LOCAL_KERNELS"].split(":"))[REPO_ID])


def test_mapping_covers_devices_and_modes(kernel):
    """Every mode on CUDA and CPU; a repo-id LOCAL_KERNELS does not name resolves by version."""
    for repo_id, version in ((REPO_ID, 1), ("org/name", 3)):
        ((layer, devices),) = kernel.integrations.kernel_mapping(repo_id, version=version).items()
        assert layer == "ApplyRotaryPosEmbVision" and set(devices) == {"cuda", "cpu"}
        repos = [repo for modes in devices.values() for repo in modes.values()]
        assert all(set(modes) == ALL_MODES for modes in devices.values())
        assert all(r.layer_name == "ApplyRotaryPosEmbVision" for r in repos)
        if repo_id == REPO_ID:
            assert all(isinstance(r, LocalLayerRepository) and r._repo_path == _local_path() for r in repos)
        else:
            assert all(isinstance(r, LayerRepository) and (r._repo_id, r._version) == ("org/name", 3) for r in repos)


@pytest.mark.kernels_ci
@pytest.mark.parametrize("mode", [Mode.INFERENCE, Mode.TRAINING], ids=["inference", "training"])
def test_kernelize_from_the_local_build(kernel, mode, gen):
    """The package's layer replaces the rotary's forward, runs the package's op (its autograd
    node), and matches float64 forward and, in training, backward."""
    S, H, D = 19, 3, 72
    model = Attention()
    with use_kernel_mapping(kernel.integrations.kernel_mapping()):
        model = kernelize(model, mode=mode, device="cpu", use_fallback=False)
    assert model.rotary.forward.__func__ is kernel.layers.ApplyRotaryPosEmbVision.forward

    q, k = (torch.randn(S, H, D, generator=gen, requires_grad=True) for _ in range(2))
    e = torch.randn(S, D, generator=gen)
    cos, sin = e.cos().requires_grad_(), e.sin().requires_grad_()
    gq, gk = (torch.randn(S, H, D, generator=gen) for _ in range(2))
    outs = model(q, k, cos, sin)
    assert "EagerRotary" in type(outs[0].grad_fn).__name__
    leaves = [t.detach().double().requires_grad_() for t in (q, k, cos, sin)]
    ref_outs = reference.reference_vision_forward(*leaves)
    for o, r in zip(outs, ref_outs):
        assert reference.rel_err(o, r) <= 2e-6
    if Mode.TRAINING in mode:
        torch.autograd.backward(outs, (gq, gk))
        ref_grads = torch.autograd.grad(ref_outs, leaves, (gq.double(), gk.double()))
        for got, r in zip((q.grad, k.grad, cos.grad, sin.grad), ref_grads):
            assert reference.rel_err(got, r) <= 2e-6
