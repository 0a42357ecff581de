"""attncheck: an attention whose backward follows the upstream gradient's strides passes; one
that keeps reading the strides of its first call, as torch 2.11's cuDNN attention did on the
H200, fails on the calls with other strides, and the command exits 1."""

import pytest
import torch

from rope_bwd_triton import __main__ as toolkit
from rope_bwd_triton import attncheck

ARGV = ["attncheck", "--device", "cpu", "--tokens", "24", "--heads", "2", "--head-dim", "72"]


class _FirstStrides(torch.autograd.Function):
    """sdpa whose backward reads its upstream gradient with the strides of the first call."""

    strides = None

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    @staticmethod
    def backward(ctx, grad):
        _FirstStrides.strides = _FirstStrides.strides or grad.stride()
        grad = grad.as_strided(grad.shape, _FirstStrides.strides, grad.storage_offset())
        leaves = [t.detach().requires_grad_() for t in ctx.saved_tensors]
        with torch.enable_grad():
            out = torch.nn.functional.scaled_dot_product_attention(*leaves)
        return torch.autograd.grad(out, leaves, grad)


def _first_strides(monkeypatch):
    monkeypatch.setattr(_FirstStrides, "strides", None)
    return _FirstStrides.apply


@pytest.mark.parametrize("layout", attncheck.LAYOUTS)
def test_sdpa_on_cpu_follows_the_strides(capsys, layout):
    assert toolkit.main([*ARGV, "--backend", "math", "--layout", layout, "--batches", "24", "40", "40", "24"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "all calls within tolerance" and len(lines) == 1 + 2 + 4 + 1


def test_a_backward_that_keeps_its_first_strides_is_caught(monkeypatch):
    gen = torch.Generator().manual_seed(1)
    rows = attncheck.check(_first_strides(monkeypatch), 24, [32, 48, 32], 2, 72, "heads", torch.bfloat16, "cpu", gen)
    errs = [max(errs) for _, *errs in rows]
    assert errs[0] <= attncheck.TOLERANCE and errs[2] <= attncheck.TOLERANCE, errs
    assert errs[1] > 0.5, errs  # unrelated gradients: about sqrt(2)
    assert rows[1][1] <= attncheck.TOLERANCE  # the forward is right


def test_the_command_exits_1_on_it(monkeypatch, capsys):
    monkeypatch.setattr(attncheck, "_attention", lambda backend: _first_strides(monkeypatch))
    assert toolkit.main([*ARGV, "--batches", "32", "48"]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "wrong results in calls [2]"


@pytest.mark.parametrize(
    ("layout", "strides"), [("heads", (2 * 40 * 72, 40 * 72, 72, 1)), ("tokens", (40 * 2 * 72, 72, 2 * 72, 1))]
)
def test_upstream_gradient_layouts(layout, strides):
    """heads: a slice of [1, H, S, D]; tokens: a slice of [1, S, H, D] (transformers' Qwen
    attention concatenates its outputs so), seen as [1, H, n, D]."""
    grad = attncheck.upstream(40, 24, 2, 72, layout, torch.bfloat16, "cpu", torch.Generator().manual_seed(0))
    assert grad.shape == (1, 2, 24, 72) and grad.stride() == strides
