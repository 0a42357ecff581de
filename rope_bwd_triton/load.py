"""Load the package the way users do: build the Hub variants into build/, point
LOCAL_KERNELS at this checkout and call kernels.get_kernel (as tests/conftest.py does)."""

import importlib
import os

from . import REPO_ROOT
from .build import build_variants, repo_id


def load_kernel(build: bool = True):
    """build=False: a worker process whose parent has built the variants (and set LOCAL_KERNELS)."""
    import kernels

    if build:
        build_variants()
    os.environ["LOCAL_KERNELS"] = f"{repo_id()}={REPO_ROOT}"
    return kernels.get_kernel(repo_id(), version=1)


def submodule(kernel, name: str):
    """A module of the loaded variant that its __init__ does not import (e.g. rotary_triton)."""
    return importlib.import_module(f"{kernel.__name__}.{name}")


def load_other(path):
    """Another build of the kernel, from a checkout whose build/ holds its variants (for A/B
    runs in one process: each build has its own ops namespace)."""
    from pathlib import Path

    import kernels

    return kernels.get_local_kernel(Path(path), trust_remote_code=True)
