"""Shared fixtures: the kernel is built into build/ once per run and loaded the
way users load it, through kernels.get_kernel (LOCAL_KERNELS points at this checkout)."""

import contextlib
import os
import zlib
from unittest import mock

import pytest
import torch

from rope_bwd_triton import REPO_ROOT
from rope_bwd_triton.build import build_variants, repo_id

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def pytest_report_header(config):
    cpu_path = "Triton kernels in the interpreter" if INTERPRET else "PyTorch path"
    return f"rope-bwd: CPU tensors run the {cpu_path}; CUDA {'available' if HAS_CUDA else 'not available'}"


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


def pytest_configure(config):
    # Build the variants once: here in a plain run, in the controller under pytest-xdist
    # (workers building the same folder at once would race).
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        build_variants()


@pytest.fixture(scope="session")
def kernel():
    import kernels

    os.environ["LOCAL_KERNELS"] = f"{repo_id()}={REPO_ROOT}"
    return kernels.get_kernel(repo_id(), version=1)


@pytest.fixture
def gen(request):
    """A generator seeded from the test's id: every test draws its own random data,
    and a failure reproduces. ROPE_SEED=<int> changes every draw."""
    seed = zlib.crc32(request.node.nodeid.encode()) ^ int(os.environ.get("ROPE_SEED", "0"))
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------- what compiled code runs

def compiled_calls(kernel, code: str) -> set:
    """What the compiled code runs of ours: "kernel" (rotary_kernel launched by inductor),
    the names of our ops it calls."""
    ns = kernel._ops.add_op_namespace_prefix("").removesuffix("::")
    names = {"rotary_fwd", "rotary_bwd", "rotary_fwd_opaque", "rotary_bwd_opaque"}
    calls = {n for n in names if f"torch.ops.{ns}.{n}.default(" in code}
    return calls | ({"kernel"} if "rotary_kernel" in code else set())


@contextlib.contextmanager
def generated_code():
    """The code inductor generates inside the block (as run_and_get_code, minus its
    dynamo reset); compiled graphs are not taken from the on-disk caches, which skip codegen."""
    from torch._inductor.graph import GraphLowering

    code = []
    with mock.patch.object(GraphLowering, "save_output_code", code.append), \
            torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        yield code
