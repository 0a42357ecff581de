"""CUDA tensors run the Triton kernel only where Triton runs it: Triton imports and the GPU's
capability is one build.toml declares (8.0 and later). Elsewhere they take the PyTorch path,
with a warning naming the reason, and never reach Triton. The GPU is faked (its capability,
fake CUDA tensors), so this runs on any machine."""

import sys
import types
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from .helpers import submodule

SHAPES = [(7, 2, 8), (7, 3, 8), (7, 4)]  # q, k, angles


@pytest.fixture
def ops(kernel, monkeypatch):
    """The package's ops module with a fresh decision cache, and the path each call takes
    recorded ("kernel" or "pytorch"), not run: fake CUDA tensors have neither data nor a GPU."""
    ops = submodule(kernel, "ops")
    ops._triton_runs_on.cache_clear()
    launched = []
    launch = type("Launch", (), {"launch_fwd": staticmethod(lambda **kw: launched.append("kernel"))})
    monkeypatch.setattr(ops, "_launch", lambda: launch)
    monkeypatch.setattr(ops.rotary_torch, "forward", lambda *args: launched.append("pytorch") or args[:2])
    yield ops, launched
    ops._triton_runs_on.cache_clear()  # the real GPU's answer for later tests


def _capability(monkeypatch, capability):
    """A GPU of this capability, with Triton importable (hub CI's CPU environment has none)."""
    monkeypatch.setitem(sys.modules, "triton", sys.modules.get("triton") or types.ModuleType("triton"))
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: asked.append(device) or capability)
    return asked


@pytest.mark.kernels_ci
@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (9, 0), (10, 0), (12, 1)])
def test_declared_capabilities_run_the_kernel(ops, monkeypatch, capability):
    ops, launched = ops
    asked = _capability(monkeypatch, capability)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ops._triton_runs_on(torch.device("cuda", 1)) is True
        assert ops._triton_runs_on(torch.device("cuda", 1)) is True  # asked once per GPU
    assert asked == [torch.device("cuda", 1)]


@pytest.mark.kernels_ci
@pytest.mark.parametrize("capability", [(7, 5), (7, 0), (6, 1)])
def test_an_older_gpu_takes_the_pytorch_path(ops, monkeypatch, capability):
    """A call on it takes the PyTorch path and launches nothing; the warning says why."""
    ops, launched = ops
    _capability(monkeypatch, capability)
    with FakeTensorMode(), pytest.warns(UserWarning, match=rf"capability {capability[0]}\.{capability[1]}"):
        fq, fk, ft = (torch.empty(*shape, device="cuda") for shape in SHAPES)  # fake: no data, no GPU
        assert ops._use_triton(fq, fk, ft) is False
        ops.forward_impl(fq, fk, ft, None, False)
    assert launched == ["pytorch"]


@pytest.mark.kernels_ci
def test_a_declared_gpu_launches_the_kernel(ops, monkeypatch):
    """The same call on a 9.0 GPU goes to the launch (here recorded, not run)."""
    ops, launched = ops
    _capability(monkeypatch, (9, 0))
    with FakeTensorMode():
        fq, fk, ft = (torch.empty(*shape, device="cuda") for shape in SHAPES)  # fake: no data, no GPU
        ops.forward_impl(fq, fk, ft, None, False)
    assert launched == ["kernel"]


@pytest.mark.kernels_ci
def test_without_triton_cuda_tensors_take_the_pytorch_path(ops, monkeypatch):
    ops, _ = ops
    asked = _capability(monkeypatch, (9, 0))
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    with pytest.warns(UserWarning, match="Triton is not installed"):
        assert ops._triton_runs_on(torch.device("cuda", 0)) is False
    assert asked == []
