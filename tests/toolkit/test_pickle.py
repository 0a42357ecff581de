"""Models that users save whole (pickle, torch.save) save and load: made kernelizable,
kernelized, or restored afterwards. The kernelized layer is a patch of the process, not
state of the model: a loaded model needs neither this package nor the patch; in a fresh
process that has not loaded the kernel it runs transformers' function and gives the
eager outputs."""

import copy
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from kernels import KernelizeFallback, LocalLayerRepository, Mode, kernelize, use_kernel_mapping

from rope_bwd_triton import REPO_ROOT, models
from rope_bwd_triton.suite import rel_err

FAMILY = "qwen3_omni_moe"
GRIDS = [[1, 4, 8], [1, 8, 4]]  # two images: the attention's per-image split runs
TOL = 1e-5  # fp32 outputs of two correct rotaries through the encoder (as test_kernelize)

# A fresh process: torch and transformers only (nothing of this repository on its path).
LOAD = textwrap.dedent("""
    import sys
    import torch
    from kernels import Mode, kernelize

    results = {}
    for name in sys.argv[2:]:
        model, inputs = torch.load(f"{sys.argv[1]}/{name}.pt", weights_only=False)
        with torch.no_grad():
            results[name] = model(*inputs).last_hidden_state
        kernelize(model, mode=Mode.INFERENCE, device="cpu")  # no stale layer for kernelize to trip on
    loaded = [m for m in sys.modules if "rope_bwd" in m]
    assert not loaded, loaded
    torch.save(results, f"{sys.argv[1]}/results.pt")
""")


@pytest.fixture
def integrations(kernel):
    yield kernel.integrations
    kernel.integrations.restore_transformers()


def kernelized(integrations, model):
    integrations.make_kernelizable(model)
    repo = LocalLayerRepository(repo_path=Path(REPO_ROOT), layer_name=integrations.LAYER_NAME)
    # Raise on any failure of ours; layers of transformers' own that this mapping does not name
    # (GeluTanh, with kernels >= 0.19) keep their forward.
    with use_kernel_mapping({integrations.LAYER_NAME: {"cpu": repo}}):
        return kernelize(model, mode=Mode.TRAINING, device="cpu", use_fallback=KernelizeFallback.NO_LAYER)


def outputs(model, inputs):
    with torch.no_grad():
        return model(*inputs).last_hidden_state


@pytest.mark.kernels_ci
def test_saved_models_load_in_a_fresh_process(kernel, integrations, tmp_path):
    eager = models.make_vision_model(FAMILY, **models.QUICK_OMNI)
    inputs = models.make_images(eager, GRIDS)
    ref = outputs(eager, inputs)
    saved = {}
    saved["kernelizable"] = copy.deepcopy(eager)
    integrations.make_kernelizable(saved["kernelizable"])
    saved["kernelized"] = kernelized(integrations, copy.deepcopy(eager))
    layer = models.modeling_module(FAMILY).apply_rotary_pos_emb_vision
    assert layer.forward.__func__ is kernel.layers.ApplyRotaryPosEmbVision.forward
    saved["built_after"] = models.make_vision_model(FAMILY, **models.QUICK_OMNI)  # attached by the constructor
    for name, model in saved.items():
        attns = [m for m in model.modules() if getattr(m, "_kernel_funcs", None)]
        assert attns and all(a._kernel_funcs[integrations.LAYER_NAME] is layer for a in attns), name
        assert rel_err(outputs(model, inputs), ref) < TOL, name
        torch.save((model, inputs), tmp_path / f"{name}.pt")
    integrations.restore_transformers()
    saved["restored"] = saved["kernelized"]  # built while patched: still holds the layer
    torch.save((saved["restored"], inputs), tmp_path / "restored.pt")

    proc = subprocess.run(
        [sys.executable, "-c", LOAD, str(tmp_path), *saved], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = torch.load(tmp_path / "results.pt")
    assert set(results) == set(saved)
    for name, out in results.items():
        assert rel_err(out, ref) < TOL, f"{name}: rel err {rel_err(out, ref):.2e}"


def test_loaded_in_a_patched_process(kernel, integrations):
    """Loaded where the patch is live: the model calls the process's layer (a module global),
    and kernelize reaches it again through make_kernelizable."""
    eager = models.make_vision_model(FAMILY, **models.QUICK_OMNI)
    inputs = models.make_images(eager, GRIDS)
    ref = outputs(eager, inputs)
    model = kernelized(integrations, copy.deepcopy(eager))
    loaded = pickle.loads(pickle.dumps(model))
    assert not any(getattr(m, "_kernel_funcs", None) for m in loaded.modules())
    assert rel_err(outputs(loaded, inputs), ref) < TOL
    loaded = kernelized(integrations, loaded)
    layer = models.modeling_module(FAMILY).apply_rotary_pos_emb_vision
    assert all(
        a._kernel_funcs[integrations.LAYER_NAME] is layer
        for a in loaded.modules()
        if isinstance(a, models.modeling_module(FAMILY).Qwen3OmniMoeVisionAttention)
    )
    assert rel_err(outputs(loaded, inputs), ref) < TOL


def test_the_layer_pickles_as_transformers_function(kernel, integrations):
    """Pickled on its own, the layer is transformers' global by name: this process's layer
    while patched, transformers' function once restored. A deepcopy keeps it."""
    integrations.make_kernelizable(families=[FAMILY])
    layer = models.modeling_module(FAMILY).apply_rotary_pos_emb_vision
    data = pickle.dumps(layer)
    assert b"rope_bwd" not in data  # nothing of this package: loads without it
    assert pickle.loads(data) is layer and copy.deepcopy(layer) is layer
    integrations.restore_transformers()
    original = models.modeling_module(FAMILY).apply_rotary_pos_emb_vision
    assert original is not layer and pickle.loads(data) is original
