"""The toolkit's tests (rope_bwd_triton: build, publish, demo, bench, tune, e2e, and the
kernelize flow on transformers models). They need the repository, so hub CI, which
holds only build.toml, torch-ext/ and tests/, does not collect them (tests/conftest.py);
none is marked kernels_ci. The package fixtures (kernel, gen) come from tests/conftest.py."""

import collections
import os
from pathlib import Path

import pytest
import torch

from rope_bwd_triton import REPO_ROOT, models
from rope_bwd_triton.build import build_variants, repo_id

from ..helpers import INTERPRET

HUB_TWINS = Path(__file__).parent / "hub_twins"  # kernels-community's layers that transformers maps


@pytest.fixture
def integrations(kernel):
    """The shipped integrations module; every function it patched put back afterwards (checked),
    so that no patch leaks into another test."""
    yield kernel.integrations
    patched = {key: patch.original for key, patch in kernel.integrations._PATCHED.items()}
    kernel.integrations.restore_transformers()
    assert not kernel.integrations._PATCHED
    for (family, name), original in patched.items():
        assert getattr(models.modeling_module(family), name) is original, (family, name)


@pytest.fixture
def rotary_calls(kernel, monkeypatch):
    """Calls of the package's layers (each layer's forward calls ops.rotary_call once), by the
    name of the transformers function it stands for: the proof that a kernelized model ran
    them, and not transformers' own rotary."""
    calls = collections.Counter()
    real = kernel.layers.rotary_call

    def counted(name, *args, **kwargs):
        calls[name] += 1
        return real(name, *args, **kwargs)

    monkeypatch.setattr(kernel.layers, "rotary_call", counted)
    return calls


@pytest.fixture
def no_tf32():
    """fp32 means fp32: cuDNN runs fp32 convolutions (the patch embedding) in TF32 by default,
    whose 10-bit inputs turn the 1e-7 differences of two correct rotaries into 1e-5 ones."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture(scope="session")
def hub_twin_builds() -> str:
    """The offline twins of transformers' default hub kernels (hub_twins/README.md), built into
    build/hub_twins/ once per process, one process at a time: a build loads each new variant in a
    process of its own, and reuses what an earlier build of the same files found. Their
    LOCAL_KERNELS entries."""
    from filelock import FileLock

    out = REPO_ROOT / "build" / "hub_twins"
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    with FileLock(out / ".lock"):
        for source in sorted(p for p in HUB_TWINS.iterdir() if (p / "build.toml").is_file()):
            build_variants(root=source, out=out / source.name / "build")
            entries.append(f"{repo_id(source)}={out / source.name}")
    return ":".join(entries)


@pytest.fixture
def hub_twins(hub_twin_builds, monkeypatch) -> str:
    """LOCAL_KERNELS names the twins too: kernels loads them for kernels-community's repo ids,
    offline, wherever transformers (or a test) asks."""
    monkeypatch.setenv("LOCAL_KERNELS", f"{os.environ['LOCAL_KERNELS']}:{hub_twin_builds}")
    return hub_twin_builds


def pytest_collection_modifyitems(config, items):
    """Under TRITON_INTERPRET=1 (scripts/test.sh's interpreter stage) the per-family tests run one
    family for each set of calls the kernel gets: a test module's INTERPRETER_KEYS maps a test's
    name to a function of (kernel, family) naming what the test launches for the family (the
    variant's layer, the shapes and dtypes of its cases; None: keep the family). Of the families
    of one key the first stays, the others are deselected: a layer's kernel is the same whatever
    family it stands for, and the CPU pass (the suite stage, and scripts/against.sh on the oldest
    transformers) checks every family's function against its layer. ROPE_INTERPRET_ALL=1 keeps
    every family."""
    if not INTERPRET or os.environ.get("ROPE_INTERPRET_ALL") == "1":
        return
    per_family = [i for i in items if i.originalname in getattr(i.module, "INTERPRETER_KEYS", {})]
    if not per_family:
        return
    import kernels

    kernel = kernels.get_kernel(repo_id(), version=1)  # as the kernel fixture loads it
    seen, dropped = set(), []
    for item in per_family:
        params = item.callspec.params
        key = item.module.INTERPRETER_KEYS[item.originalname](kernel, params["family"])
        if key is None:
            continue
        key = (item.originalname, params.get("device"), key)
        if key in seen:
            dropped.append(item)
        seen.add(key)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(map(id, dropped))
        items[:] = [i for i in items if id(i) not in gone]
