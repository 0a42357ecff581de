"""Saving kernelized models, as users save them.

save_pretrained / from_pretrained (weights and configuration) is untouched by the patch: the
files of a kernelized model load into a model that kernelize_rotary kernelizes again, with
the same outputs.

torch.save of a whole model pickles what kernels' decorators attach to its attention modules
(`_kernel_funcs`), as kernels pickles it:
- kernels whose function layer pickles (0.19): a per-module copy of the module global, by reference to that global
  (kernels' _rebuild_kernel_func builds one of its class) and, kernelized, its forward by
  reference to this package's layer module. A fresh process that first loads the kernel
  (get_kernel) and calls make_kernelizable(families=[...]) loads the model and gives its
  outputs. Without those steps: a model of a family transformers marks itself, not kernelized,
  loads and runs transformers' rotary; kernelized, its forward (and kernelize_rotary's forward
  pre-hook) names the build's module, which is not imported (ModuleNotFoundError); any function
  transformers does not mark (the vision encoders') is a plain function there, which kernels
  cannot rebuild (TypeError). restore_transformers takes back what make_kernelizable attached:
  a restored model loads anywhere.
- kernels whose function layer does not (0.17): it is a class local to kernels' factory, which pickle cannot
  name: torch.save raises, for a model made kernelizable or kernelized.
"""

import copy
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import kernels
import pytest
import torch
from kernels import Mode

from rope_bwd_triton import models

from ..helpers import REPO_ID
from ..reference import rel_err
from .test_kernelize_transformers import assert_kernelized, attached_layers


def _identity(x):
    return x


# Whether kernels' function layers pickle (by reference, from 0.19), or are classes local to its
# factory (0.17): told by the class kernels makes, not by a version number.
KERNELS_PICKLES = "__reduce__" in vars(type(kernels.use_kernel_forward_from_hub("Identity")(_identity)))
TOL = 1e-5  # fp32 outputs of two correct rotaries through the model
# Tiny float32 models holding both rotary functions (Qwen3-VL) or the decoders' alone (Llama).
FAMILIES = ("llama", "qwen3_vl")

# A fresh process: torch, kernels and transformers (nothing of this repository on its path).
# argv: folder, "prepared" (get_kernel and make_kernelizable first) or "bare", the saved names.
LOAD = textwrap.dedent("""
    import sys
    import torch

    folder, how, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    if how == "prepared":
        from kernels import get_kernel

        kernel = get_kernel("%s", version=1)
        kernel.integrations.make_kernelizable(families=%r)
    results = {}
    for name in names:
        try:
            model, inputs = torch.load(f"{folder}/{name}.pt", weights_only=False)
        except Exception as e:
            results[name] = (type(e).__name__, str(e))
            continue
        with torch.no_grad():
            results[name] = model(**inputs).logits
        # how many of its attached rotaries run the package's layers
        funcs = [f for m in model.modules() for f in m.__dict__.get("_kernel_funcs", {}).values()]
        results[name + ":ours"] = sum("rope_bwd" in getattr(f.forward, "__module__", "") for f in funcs)
    assert how == "prepared" or not [m for m in sys.modules if "rope_bwd" in m]
    torch.save(results, f"{folder}/results-{how}.pt")
""") % (REPO_ID, list(FAMILIES))


@pytest.fixture(scope="module")
def built():
    """family -> (eager model, its keyword inputs, its eager logits)."""
    out = {}
    for family in FAMILIES:
        if family in models.DECODERS:
            model = models.make_decoder_model(family)
            inputs = dict(input_ids=models.make_tokens(model, 2, 7))
        else:
            model = models.WHOLE[family]()
            inputs = models.whole_inputs(model)["prompt"]
        out[family] = model, inputs, logits(model, inputs)
    return out


def logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


def kernelized(integrations, model):
    return integrations.kernelize_rotary(model, mode=Mode.TRAINING, device="cpu")


@pytest.mark.parametrize("family", FAMILIES)
def test_save_pretrained_round_trip(kernel, integrations, built, family, tmp_path):
    """A kernelized model's save_pretrained files load with from_pretrained (a local folder,
    offline) into a model that kernelize_rotary kernelizes again: the same outputs."""
    eager, inputs, ref = built[family]
    model = kernelized(integrations, copy.deepcopy(eager))
    out = logits(model, inputs)
    assert rel_err(out, ref) < TOL
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path)
    assert loaded.dtype == model.dtype
    loaded = kernelized(integrations, loaded)
    assert_kernelized(kernel, loaded, *attached_layers(kernel, model))
    assert rel_err(logits(loaded, inputs), out) < TOL


def _fresh_process(folder, how, names):
    """LOAD in a fresh process, from `folder`: name -> logits, or (error type, message); name +
    ":ours" -> how many of the loaded model's attached rotaries run the package's layers."""
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    # absolute: the child runs in `folder` (scripts/newest.sh lays packages over .venv by a relative path)
    env["PYTHONPATH"] = os.pathsep.join(
        str(Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p
    )
    proc = subprocess.run(
        [sys.executable, "-c", LOAD, str(folder), how, *names],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return torch.load(Path(folder) / f"results-{how}.pt")


def test_torch_save_of_a_whole_model(kernel, integrations, built, tmp_path):
    """torch.save of whole models, made kernelizable or kernelized, as the module's docstring
    says for the installed kernels; loaded in fresh processes, prepared and bare."""
    saved, outs, marked = {}, {}, {}
    for family, (eager, inputs, ref) in built.items():
        for how in ("kernelizable", "kernelized"):
            model = copy.deepcopy(eager)
            if how == "kernelizable":
                integrations.make_kernelizable(model)
            else:
                kernelized(integrations, model)
            name = f"{family}-{how}"
            saved[name], outs[name] = model, logits(model, inputs)
            assert rel_err(outs[name], ref) < TOL, name
        # whether transformers marks every function of the family itself (kernels' hub decorator)
        patches = [p for (f, _), p in integrations._PATCHED.items() if f == family]
        marked[family] = all(p.layer_name is not None for p in patches)
    if not KERNELS_PICKLES:
        for name, model in saved.items():
            with pytest.raises(AttributeError, match=r"Can't pickle local object '_create_func_module.<locals>.Func'"):
                torch.save((model, built[name.split("-")[0]][1]), tmp_path / f"{name}.pt")
        return
    for name, model in saved.items():
        torch.save((model, built[name.split("-")[0]][1]), tmp_path / f"{name}.pt")
    integrations.restore_transformers()  # this process's patch is not what the children load under

    prepared = _fresh_process(tmp_path, "prepared", list(saved))
    for name in saved:
        out = prepared[name]
        assert isinstance(out, torch.Tensor), f"{name}: {out}"
        assert rel_err(out, outs[name]) < TOL, f"{name}: rel err {rel_err(out, outs[name]):.2e}"
        assert (prepared[name + ":ours"] > 0) == name.endswith("kernelized"), name  # the layer kept

    bare = _fresh_process(tmp_path, "bare", list(saved))
    for name in saved:
        got, (family, how) = bare[name], name.split("-")
        if how == "kernelized":
            assert got == ("ModuleNotFoundError", f"No module named '{kernel.layers.__name__.split('.')[0]}'"), got
        elif not marked[family]:
            assert got[0] == "TypeError" and "missing required argument 'code'" in got[1], (name, got)
        else:  # transformers' own rotary, as eager
            assert isinstance(got, torch.Tensor), (name, got)
            assert rel_err(got, built[family][2]) < TOL


def entries(model) -> list:
    return [n for m in model.modules() for n in vars(m).get("_kernel_funcs", {})]


def test_restored_models_pickle(kernel, integrations, built, tmp_path):
    """make_kernelizable, then restore_transformers: a model passed to it and one built while it
    was in force keep nothing of it, so that they pickle and load in a fresh process without this
    package, and give transformers' outputs (kernels rebuilds an entry left behind from the module
    global, which restore makes transformers' plain function again: it could not load)."""
    eager, inputs, ref = built["qwen3_vl"]
    saved = {"passed": copy.deepcopy(eager)}
    integrations.make_kernelizable(saved["passed"])
    saved["built"] = models.WHOLE["qwen3_vl"]()  # the same seed: eager's weights
    assert all("_kernel_funcs" in vars(m.model.visual.blocks[0].attn) for m in saved.values())
    integrations.restore_transformers()
    for name, model in saved.items():
        assert entries(model) == entries(eager), name  # transformers' own (its marked decoder rotary)
        assert rel_err(logits(model, inputs), ref) < TOL, name
        torch.save((model, inputs), tmp_path / f"{name}.pt")
    bare = _fresh_process(tmp_path, "bare", list(saved))
    for name in saved:
        assert isinstance(bare[name], torch.Tensor), (name, bare[name])
        assert rel_err(bare[name], ref) < TOL and bare[name + ":ours"] == 0, name
