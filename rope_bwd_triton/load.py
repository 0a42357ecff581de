"""Load the package the way users do: build the Hub variants into build/, point
LOCAL_KERNELS at this checkout and call kernels.get_kernel (as tests/conftest.py does)."""

import importlib
import os

from . import REPO_ROOT
from .build import build_variants, repo_id


def use_local_build(build: bool = True):
    """LOCAL_KERNELS names this checkout, for this process and those it starts. build=False: a
    worker process whose parent has built the variants (and set LOCAL_KERNELS)."""
    if build:
        build_variants()
    os.environ["LOCAL_KERNELS"] = f"{repo_id()}={REPO_ROOT}"


def load_kernel(build: bool = True):
    """The package from build/, through kernels.get_kernel (use_local_build's build)."""
    import kernels

    use_local_build(build)
    return kernels.get_kernel(repo_id(), version=1)


def submodule(kernel, name: str):
    """A module of the loaded variant that its __init__ does not import (e.g. launch)."""
    return importlib.import_module(f"{kernel.__name__}.{name}")


def load_other(path):
    """Another build of the kernel, from a checkout whose build/ holds its variants (for A/B
    runs in one process: each build has its own ops namespace)."""
    from pathlib import Path

    import kernels

    return kernels.get_local_kernel(Path(path), trust_remote_code=True)
