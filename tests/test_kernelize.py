"""kernels.kernelize with the package's mapping, as a user of the kernels library writes it:
a module under one of the package's layer names (one per variant of transformers' vision
rotary: rotate_half or interleaved pairs, outputs in the inputs' dtypes or promoted with
cos/sin) gets the package's layer of that name; a function marked as transformers marks its
decoders' rotary ("rotary_pos_emb", attached by use_kernelized_func) gets the decoder layer.

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
    use_kernelized_func,
)

from . import reference
from .helpers import REPO_ID

ALL_MODES = {Mode.INFERENCE, Mode.TRAINING, Mode.INFERENCE | Mode.TORCH_COMPILE, Mode.TRAINING | Mode.TORCH_COMPILE}


def _rotary(q, k, cos, sin, interleaved, promotes):
    """transformers' vision rotary in each variant, in the inputs' dtypes: the first R =
    cos.shape[-1] channels rotated (rotate_half, or rotate_pairwise's interleaved pairs),
    the rest passed through; outputs in the inputs' dtypes (promoted with cos/sin) or
    cast back to them."""
    R = cos.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]

    def rotary(x):
        x_rot, x_pass = x[..., :R], x[..., R:]
        if interleaved:
            pairs = x_rot.unflatten(-1, (-1, 2))
            turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
        else:
            turned = reference.rotate_half(x_rot)
        y = torch.cat((x_rot * c + turned * s, x_pass), dim=-1)
        return y if promotes else y.to(x.dtype)

    return rotary(q), rotary(k)


def _model(layer_name):
    """A model whose own rotary is the layer `layer_name` stands for."""
    interleaved, promotes = "Interleaved" in layer_name, "Promoted" in layer_name

    @use_kernel_forward_from_hub(layer_name)
    class Rotary(torch.nn.Module):
        def forward(self, q, k, cos, sin):
            return _rotary(q, k, cos, sin, interleaved, promotes)

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rotary = Rotary()

        def forward(self, q, k, cos, sin):
            return self.rotary(q, k, cos, sin)

    return Attention()


def _local_path() -> Path:
    return Path(dict(e.split("=", 1) for e in os.environ["LOCAL_KERNELS"].split(":"))[REPO_ID])


def test_mapping_covers_devices_and_modes(kernel):
    """Every layer name and transformers' hook "rotary_pos_emb", every mode on CUDA and CPU;
    a repo-id LOCAL_KERNELS does not name resolves by version."""
    names = kernel.integrations.LAYER_NAMES
    assert names[0] == "ApplyRotaryPosEmbVision" and len(set(names)) == len(kernel.layers.VARIANTS) == 28
    assert all(isinstance(getattr(kernel.layers, name), type) for name in names)
    for repo_id, version in ((REPO_ID, 1), ("org/name", 3)):
        mapping = kernel.integrations.kernel_mapping(repo_id, version=version)
        assert list(mapping) == [*names, "rotary_pos_emb"]
        for name, devices in mapping.items():
            assert set(devices) == {"cuda", "cpu"} and all(set(modes) == ALL_MODES for modes in devices.values())
            repos = [repo for modes in devices.values() for repo in modes.values()]
            layer = "ApplyRotaryPosEmbPromoted" if name == "rotary_pos_emb" else name
            assert all(r.layer_name == layer for r in repos)
            if repo_id == REPO_ID:
                assert all(isinstance(r, LocalLayerRepository) and r._repo_path == _local_path() for r in repos)
            else:
                assert all(
                    isinstance(r, LayerRepository) and (r._repo_id, r._version) == ("org/name", 3) for r in repos
                )


@pytest.mark.kernels_ci
@pytest.mark.parametrize("mode", [Mode.INFERENCE, Mode.TRAINING], ids=["inference", "training"])
@pytest.mark.parametrize(
    "layer_name",
    [
        "ApplyRotaryPosEmbVision",
        "ApplyRotaryPosEmbVisionInterleaved",
        "ApplyRotaryPosEmbVisionPromoted",
        "ApplyRotaryPosEmbVisionInterleavedPromoted",
    ],
)
def test_kernelize_from_the_local_build(kernel, layer_name, mode, gen):
    """The package's layer of each name replaces the rotary's forward, runs the package's op
    (its autograd node), and matches float64 forward and, in training, backward: full and
    partial rotary, q [S, H, D] and [B, S, H, D], the outputs' dtypes those of the model's
    own rotary (bf16 q, float32 k and tables)."""
    S, H, HK, D = 19, 3, 2, 72
    interleaved, promotes = "Interleaved" in layer_name, "Promoted" in layer_name
    model = _model(layer_name)
    with use_kernel_mapping(kernel.integrations.kernel_mapping()):
        model = kernelize(model, mode=mode, device="cpu", use_fallback=False)
    assert model.rotary.forward.__func__ is getattr(kernel.layers, layer_name).forward

    for lead, R in (((S,), D), ((S,), D - 6), ((2, S), D)):
        q = torch.randn(*lead, H, D, generator=gen).bfloat16().requires_grad_()
        k = torch.randn(*lead, HK, D, generator=gen, requires_grad=True)
        e = torch.randn(S, R, generator=gen)
        cos, sin = e.cos().requires_grad_(), e.sin().requires_grad_()
        outs = model(q, k, cos, sin)
        assert "EagerRotary" in type(outs[0].grad_fn).__name__ or lead != (S,)
        with torch.no_grad():
            assert [o.dtype for o in outs] == [o.dtype for o in _rotary(q, k, cos, sin, interleaved, promotes)]
        leaves = [t.detach().double().requires_grad_() for t in (q, k, cos, sin)]
        ref_outs = _rotary(*leaves, interleaved, True)
        for o, r in zip(outs, ref_outs):
            assert reference.rel_err(o, r) <= (4e-3 if o.dtype == torch.bfloat16 else 2e-6), (lead, R)
        if Mode.TRAINING in mode:
            cot = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs]
            grads = torch.autograd.grad(outs, (q, k, cos, sin), cot)
            ref_grads = torch.autograd.grad(ref_outs, leaves, [c.double() for c in cot])
            for got, r in zip(grads, ref_grads):
                assert reference.rel_err(got, r) <= (4e-3 if got.dtype == torch.bfloat16 else 2e-6), (lead, R)


def _decoder_rotary(q, k, cos, sin, unsqueeze_dim=1):
    """Llama's decoder rotary, as transformers writes it (in the inputs' dtypes)."""
    c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * c + reference.rotate_half(q) * s, k * c + reference.rotate_half(k) * s


@pytest.mark.kernels_ci
@pytest.mark.parametrize("mode", [Mode.INFERENCE, Mode.TRAINING], ids=["inference", "training"])
def test_kernelize_a_marked_decoder_function(kernel, mode, gen):
    """A function marked "rotary_pos_emb" and attached to its attention class, as transformers
    does for its decoders, runs the package's decoder layer once kernelized: float64 values and
    gradients for the attention classes' [B, H, S, D] views with GQA, tables per sequence and
    shared by the batch, and [B, S, H, D] with unsqueeze_dim=2."""
    fn = use_kernel_forward_from_hub("rotary_pos_emb")(_decoder_rotary)

    @use_kernelized_func(fn)
    class Attention(torch.nn.Module):
        def forward(self, q, k, cos, sin, unsqueeze_dim=1):
            return fn(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    with use_kernel_mapping(kernel.integrations.kernel_mapping()):
        model = kernelize(Attention(), mode=mode, device="cpu", use_fallback=False)
    assert model._kernel_funcs["rotary_pos_emb"].forward.__func__ is kernel.layers.ApplyRotaryPosEmbPromoted.forward

    B, S, HQ, HK, D = 3, 11, 4, 2, 64
    for table_batch, unsqueeze_dim in ((B, 1), (1, 1), (B, 2)):
        proj = torch.randn(B, S, (HQ + HK) * D, generator=gen).bfloat16()
        q, k = (x.unflatten(-1, (-1, D)) for x in proj.split([HQ * D, HK * D], -1))
        if unsqueeze_dim == 1:
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
        e = torch.randn(table_batch, S, D, generator=gen)
        cos, sin = e.cos().bfloat16().requires_grad_(), e.sin().bfloat16().requires_grad_()
        outs = model(q, k, cos, sin, unsqueeze_dim)
        # the package's op: its output made in q's layout, not a view of one (no node between)
        assert "Rotary" in type(outs[0].grad_fn).__name__, type(outs[0].grad_fn)
        assert [o.dtype for o in outs] == [torch.bfloat16] * 2 and outs[0].shape == q.shape
        leaves = [t.detach().double().requires_grad_() for t in (q, k, cos, sin)]
        ref_outs = _decoder_rotary(*leaves, unsqueeze_dim)
        for o, r in zip(outs, ref_outs):
            assert reference.rel_err(o, r) <= 4e-3, (table_batch, unsqueeze_dim)
        if Mode.TRAINING in mode:
            cot = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs]
            grads = torch.autograd.grad(outs, (q, k, cos, sin), cot)
            ref_grads = torch.autograd.grad(ref_outs, leaves, [c.double() for c in cot])
            for got, r in zip(grads, ref_grads):
                assert got.shape == r.shape and reference.rel_err(got, r) <= 4e-3, (table_batch, unsqueeze_dim)
