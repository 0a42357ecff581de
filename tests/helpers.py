"""What package tests share besides the reference math: the kernel's repo-id, the
devices to run on, which compute path a device takes, and what torch.compile'd code
runs of ours."""

import contextlib
import importlib
import os
import tomllib
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parent.parent  # holds build.toml, torch-ext/ and tests/
REPO_ID = tomllib.loads((ROOT / "build.toml").read_text())["general"]["hub"]["repo-id"]

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
# Whole models compiled on each device: on CPU aot_eager, dynamo's graph and the autograd graph as
# inductor gets them (inductor would spend its time compiling C++ for a whole model; its CPU code
# of our ops is checked on single modules in test_compile).
COMPILE_BACKEND = {"cpu": "aot_eager", "cuda": "inductor"}


def kernel_path(device) -> bool:
    """Whether float32/bf16/fp16 tensors on `device` run the Triton kernel (else the PyTorch path)."""
    return device == "cuda" or INTERPRET


def submodule(kernel, name: str):
    """A module of the loaded variant that its __init__ does not import (launch, fast_launch, ...:
    they import Triton, which hub CI's CPU environment lacks)."""
    return importlib.import_module(f"{kernel.__name__}.{name}")


def compiled_calls(kernel, code: str) -> set:
    """What the compiled code runs of ours: "kernel" (rotary_kernel launched by inductor),
    the names of our ops it calls."""
    ns = kernel._ops.add_op_namespace_prefix("").removesuffix("::")
    calls = {n for n in ("rotary_fwd", "rotary_bwd", "rope_bwd_out") if f"torch.ops.{ns}.{n}.default(" in code}
    return calls | ({"kernel"} if "rotary_kernel" in code else set())


@contextlib.contextmanager
def generated_code():
    """The code inductor generates inside the block (as run_and_get_code, minus its
    dynamo reset); compiled graphs are not taken from the on-disk caches, which skip codegen."""
    from torch._inductor.graph import GraphLowering

    code = []
    with (
        mock.patch.object(GraphLowering, "save_output_code", code.append),
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        yield code


INTERPRETER_LOOPS = "this Triton's interpreter cannot run loops under this NumPy"  # a skip reason


def interpreter_runs_loops() -> bool:
    """Triton 3.6's interpreter cannot run a loop with a runtime bound under NumPy >= 2.4
    (it calls int() on a one-element array): seen with triton 3.6.0 and numpy 2.4.6 / 2.5.2,
    fine with numpy 2.3.5 or triton 3.9.0. The compiled GPU path is not affected."""
    import re

    import numpy
    import triton

    def version(v):
        return tuple(int(x) for x in re.findall(r"\d+", v)[:2])

    return version(triton.__version__) >= (3, 9) or version(numpy.__version__) < (2, 4)
