"""The toolkit's tests (rope_bwd_triton: build, publish, demo, bench, tune, e2e, and the
kernelize flow on transformers models). They need the repository, so hub CI, which
holds only build.toml, torch-ext/ and tests/, does not collect them (tests/conftest.py);
none is marked kernels_ci. The package fixtures (kernel, gen) come from tests/conftest.py."""

import collections

import pytest

from rope_bwd_triton import models


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
