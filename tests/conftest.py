"""Package tests: they stand on the shipped package alone, as hub CI runs them
(`pytest tests -m kernels_ci` next to kernel-builder's build, with only torch,
kernels and pytest installed, LOCAL_KERNELS naming the build).

The kernel is loaded the way users load it, kernels.get_kernel(<repo-id>, version=1);
LOCAL_KERNELS must name where the variants are (hub CI sets it; in the repository the
root conftest.py builds build/ and sets it). Every test runs offline (tests/offline.py).

Under TRITON_INTERPRET=1 (scripts/test.sh's second pass: the Triton kernel itself runs
on CPU tensors, a few hundred times slower than on the PyTorch path) only the package tests
and parametrizations marked `interpret` are collected (tests/*.py; the toolkit's own tests
choose their sizes themselves): each kernel branch and layout once, on small shapes, rather
than the whole product of parameters that the CPU and GPU passes run.
`@pytest.mark.interpret` keeps every parametrization of a test; `@pytest.mark.interpret(
name=value or [values], ...)` those whose parameters take these values; several such marks
keep the union. ROPE_INTERPRET_ALL=1 keeps everything.

ROPE_CUDA_ONLY=1 (a GPU run: scripts/gpu.sh release) collects only what may touch CUDA: it drops
every parametrization with a parameter on the CPU (a device of DEVICES, a fixture's param) and
the tests marked `cpu_only`; CI runs those on every commit. A test with no device parameter
stays unless marked: it may take a CUDA path where a GPU is present (the toolkit's commands do).
"""

import os
import types
import zlib
from pathlib import Path

import pytest

# inductor compiles in the process that asks, not in a pool of worker processes that each import
# torch again (read when torch._inductor is first imported): the tests' parallelism is
# pytest-xdist's workers, and the toolkit's commands they start inherit this
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch

from . import interpreter, offline, skips
from .helpers import HAS_CUDA, INTERPRET, REPO_ID, ROOT

# The toolkit's tests need the repository's toolkit next to tests/; hub CI's copy holds
# only build.toml, torch-ext/ and tests/ (whatever the current directory has).
collect_ignore = [] if (ROOT / "rope_bwd_triton").is_dir() else ["toolkit"]


_PATCHED_ONCE = pytest.StashKey[bool]()


def pytest_configure(config):
    # Here rather than in pyproject.toml, which hub CI replaces with kernel-builder's.
    config.addinivalue_line("markers", "kernels_ci: fast subset that hub CI runs (`nix run .#ci-test`)")
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
    config.addinivalue_line(
        "markers",
        "whole_gpu: needs the GPU to itself (most of an 80 GB GPU's memory, or timings that other tests' "
        "kernels would disturb): run alone (scripts/gpu.sh tests-big)",
    )
    config.addinivalue_line(
        "markers", "interpret(**params): the parametrizations collected under TRITON_INTERPRET=1 (tests/conftest.py)"
    )
    config.addinivalue_line(
        "markers", "cpu_only: never takes a CUDA path, GPU or not: ROPE_CUDA_ONLY=1 leaves it out (tests/conftest.py)"
    )
    # torch.compile users would see it: dynamo traced through a cache of ours
    config.addinivalue_line(
        "filterwarnings", "error:Dynamo detected a call to a `functools.lru_cache`-wrapped function:UserWarning"
    )
    offline.install()
    config.stash[_PATCHED_ONCE] = INTERPRET and interpreter.install()
    if not config.pluginmanager.has_plugin("tests.skips"):  # `-p tests.skips` registers it too
        config.pluginmanager.register(skips, "tests.skips")


def pytest_report_header(config):
    cpu_path = "PyTorch path"
    if INTERPRET:
        once = "once" if config.stash[_PATCHED_ONCE] else "at every device-function call (tests/interpreter.py)"
        cpu_path = f"Triton kernels in the interpreter (interpret-marked cases; triton.language patched {once})"
    return (
        f"rope-bwd: CPU tensors run the {cpu_path}; CUDA {'available' if HAS_CUDA else 'not available'}; "
        f"LOCAL_KERNELS={os.environ.get('LOCAL_KERNELS')}"
    )


def _interpreted(item) -> bool:
    """Whether an interpret mark of the item selects its parametrization."""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    for mark in item.iter_markers("interpret"):
        unknown = set(mark.kwargs) - set(params)
        if unknown:  # a misspelt name would drop the test without a word
            raise pytest.UsageError(f"{item.nodeid}: interpret mark names no parameter {sorted(unknown)}")
        if all(params[n] in (v if isinstance(v, list) else [v]) for n, v in mark.kwargs.items()):
            return True
    return False


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)
    if INTERPRET and os.environ.get("ROPE_INTERPRET_ALL") != "1":
        here = Path(__file__).parent
        _deselect(config, items, [item for item in items if item.path.parent == here and not _interpreted(item)])
    if os.environ.get("ROPE_CUDA_ONLY") == "1":
        _deselect(config, items, [item for item in items if cpu_only(item)])
    # ROPE_SHARD=k/n: the k-th of n shards, by a hash of each test's id (every xdist worker
    # collects the same; scripts/gpu.sh runs the suite in shards that each fit a device call)
    if os.environ.get("ROPE_SHARD"):
        k, n = map(int, os.environ["ROPE_SHARD"].split("/"))
        _deselect(config, items, [item for item in items if zlib.crc32(item.nodeid.encode()) % n != k - 1])


def cpu_only(item) -> bool:
    """Whether the test runs on the CPU alone wherever it runs: one of its parameters is the CPU
    (DEVICES' "cpu", a torch.device), or it is marked cpu_only."""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    on_cpu = any(isinstance(v, str | torch.device) and str(v) == "cpu" for v in params.values())
    return on_cpu or item.get_closest_marker("cpu_only") is not None


def _deselect(config, items, dropped):
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        kept = set(map(id, dropped))
        items[:] = [item for item in items if id(item) not in kept]


@pytest.fixture(autouse=True)
def _no_network():
    """A test that tried the network fails, whatever the library that tried made of the refusal."""
    before = len(offline.attempts)
    yield
    assert len(offline.attempts) == before, f"network access attempted: {offline.attempts[before:]}"


@pytest.fixture(scope="session")
def kernel():
    """The package, as users load it; from the build LOCAL_KERNELS names."""
    import kernels

    if REPO_ID not in os.environ.get("LOCAL_KERNELS", ""):
        pytest.fail(f"LOCAL_KERNELS must name {REPO_ID}=<folder holding the built variants>")
    return kernels.get_kernel(REPO_ID, version=1)


@pytest.fixture
def gen(request):
    """A generator seeded from the test's id: every test draws its own random data,
    and a failure reproduces. ROPE_SEED=<int> changes every draw."""
    seed = zlib.crc32(request.node.nodeid.encode()) ^ int(os.environ.get("ROPE_SEED", "0"))
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def launches(kernel, monkeypatch):
    """The kernel launches of the test, "fwd" or "bwd" each: the ops reach launch.py only
    through ops._launch(), on the kernel's path, so counting there imports no Triton where
    the PyTorch path runs (hub CI has none)."""
    calls = []
    real = kernel.ops._launch

    def counted(direction):
        def launch(**kwargs):
            calls.append(direction)
            return getattr(real(), f"launch_{direction}")(**kwargs)

        return launch

    proxy = types.SimpleNamespace(launch_fwd=counted("fwd"), launch_bwd=counted("bwd"))
    monkeypatch.setattr(kernel.ops, "_launch", lambda: proxy)
    return calls
