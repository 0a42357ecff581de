"""The flows users run, through transformers' own kernel management.

transformers loads a model with its kernels on (unless `use_kernels=False` or USE_HUB_KERNELS=0)
and kernelizes it again, with its own mapping and the model's `kernel_config` over it, at every
change between train() and eval(): the Trainer makes such changes at each evaluation. These tests
load tiny models with `from_pretrained` as users do, a decoder (Llama) and a vision-language model
(Qwen3-VL: its vision encoder's rotary and its decoder's), kernelize them as the README says, and
count the package's calls at every forward: each rotary of the model runs the package's layer,
and the results are eager transformers' (float32, within 1e-5). On CUDA, transformers' default
mapping asks the Hub for kernels-community's kernels (rotary, RMSNorm, activations): the Hub is
unreachable here, as in CI (`hub_offline`), and their offline twins (hub_twins/README.md) serve
them through LOCAL_KERNELS, so that transformers' defaults load there as they do with the Hub.
"""

import copy
import importlib
import inspect
import sys
import warnings

import pytest
import torch
from kernels import Mode

from rope_bwd_triton import models

from ..helpers import DEVICES, HAS_CUDA, REPO_ID
from ..reference import rel_err

TOL = 1e-5  # float32 results of two correct rotaries through a tiny model
# on CUDA, float32 convolutions in float32 (cuDNN takes TF32 by default: the patch embedding's
# weight gradient then differs by 1.2e-5 between two correct rotaries, seen on an H100)
pytestmark = pytest.mark.usefixtures("no_tf32")
FAMILIES = ("llama", "qwen3_vl")  # a decoder; a vision encoder and a decoder in one model
# How the model is loaded (transformers 5.25 turns its kernels on by default, 5.24 off).
LOADS = {"defaults": {}, "use_kernels=True": {"use_kernels": True}, "use_kernels=False": {"use_kernels": False}}
# What takes the package's layers away: another kernel_config, and transformers' resets (from 5.25).
RESETS = ["set_use_kernels(kernel_config=KernelConfig({}))"] + [
    r for r, attr in (("reset_kernels()", "reset_kernels"), ("kernels_mode=None", "kernels_mode"))
    if hasattr(importlib.import_module("transformers").PreTrainedModel, attr)
]  # fmt: skip


def make(family, seed=0):
    return models.make_qwen3_vl(seed=seed) if family == "qwen3_vl" else models.make_decoder_model(family, seed=seed)


def batch(model, family, seed):
    """The keyword inputs of one step, labels included."""
    if family == "qwen3_vl":
        prompt = models.whole_inputs(model, seed=seed)["prompt"]
    else:
        prompt = {"input_ids": models.make_tokens(model, 2, 9, seed=seed)}
    return prompt | {"labels": prompt["input_ids"]}


@pytest.fixture
def saved(tmp_path):
    """save_pretrained of a random-init tiny model of a family, once per family: its folder."""
    folders = {}

    def folder(family):
        if family not in folders:
            folders[family] = tmp_path / family
            make(family).save_pretrained(folders[family])
        return folders[family]

    return folder


@pytest.fixture
def load(saved, hub_offline, request):
    """from_pretrained of the saved model, as users load it (transformers' defaults unless told).
    On CUDA with transformers' kernels on, its default mapping loads kernels-community's CUDA
    kernels (activations, RMSNorm, rotary) at from_pretrained, and kernels raises where the Hub is
    unreachable (offline: not cached; refused: its publisher check), before this package runs:
    there their offline twins serve (`hub_twins`)."""

    def loaded(family, device="cpu", **kwargs):
        if device == "cuda":
            request.getfixturevalue("hub_twins")
        return type(make(family)).from_pretrained(saved(family), device_map=device, **kwargs)

    return loaded


@pytest.fixture
def hub_offline(monkeypatch):
    """The Hub unreachable, as in CI (HF_HUB_OFFLINE=1): transformers' default mapping asks for its
    CUDA kernels (kernels-community/rotary, ...), which kernels then looks for in its cache alone,
    finds none of and falls back from. (Without offline mode a refused connection fails kernels'
    check of the publisher, and from_pretrained with it.)"""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def forward_counts(kernel, model, inputs, rotary_calls, *, backward):
    """One forward (and backward) of `model` on `inputs`: the package's calls it made, and what
    each of its rotaries runs (the package's layer names, None where transformers' own)."""
    before = sum(rotary_calls.values())
    with torch.set_grad_enabled(backward):
        out = model(**inputs)
    if backward:
        out.loss.backward()
    return sum(rotary_calls.values()) - before, kernel.integrations.kernelized_layers(model), out.loss


def assert_runs_ours(kernel, model, inputs, rotary_calls, *, backward=True):
    calls, layers, loss = forward_counts(kernel, model, inputs, rotary_calls, backward=backward)
    assert layers and None not in layers and calls == len(layers), (calls, layers)
    return loss


def to(inputs, device):
    return {k: v.to(device) for k, v in inputs.items()}


@pytest.mark.parametrize(
    "device,how",
    [(d, h) for d in DEVICES for h in [*LOADS, "USE_HUB_KERNELS=0"]],
)
@pytest.mark.parametrize("family", FAMILIES)
def test_loaded_model_keeps_the_layers_through_train_and_eval(
    kernel, integrations, load, rotary_calls, monkeypatch, family, how, device
):
    """from_pretrained (transformers' defaults, use_kernels=True or False, or USE_HUB_KERNELS=0), then
    kernelize_rotary as the README says, then train()/eval() in any order: every forward runs the
    package's layer at each rotary, and the loss is eager transformers'."""
    if how == "USE_HUB_KERNELS=0":
        monkeypatch.setenv("USE_HUB_KERNELS", "0")
    eager = load(family, device, use_kernels=False)
    model = load(family, device, **LOADS.get(how, {}))
    if how != "defaults":
        assert model.use_kernels == (how == "use_kernels=True")
    integrations.kernelize_rotary(model, mode=Mode.TRAINING, device=device)
    inputs = to(batch(model, family, seed=1), device)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="rope-bwd")  # the package does not warn here
        for switch in ("train", "eval", "eval", "train", "eval", "train"):
            getattr(model, switch)()
            getattr(eager, switch)()
            loss = assert_runs_ours(kernel, model, inputs, rotary_calls, backward=switch == "train")
            ref = eager(**inputs).loss
            assert rel_err(loss.detach(), ref.detach()) < TOL, switch


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("device", DEVICES)
def test_trainer_with_evaluations(kernel, integrations, load, rotary_calls, tmp_path, family, device):
    """transformers.Trainer, four steps with an evaluation after every second one (each a switch
    between train() and eval()): every training step and every evaluation ran the package's layer
    at each rotary, and the losses of every step and evaluation, and the trained weights, are
    those of the same run with transformers' own rotary (same seed)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Counts(TrainerCallback):
        """The package's calls at each step's end and each evaluation."""

        def __init__(self):
            self.events = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.events.append(("begin", sum(rotary_calls.values())))

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.events.append(("step", sum(rotary_calls.values())))

        def on_evaluate(self, args, state, control, model=None, **kwargs):
            self.events.append(("evaluate", sum(rotary_calls.values())))

    class Recorded(Trainer):
        losses: list

        def compute_loss(self, model, inputs, *args, **kwargs):
            out = super().compute_loss(model, inputs, *args, **kwargs)
            self.losses.append((model.training, (out[0] if isinstance(out, tuple) else out).item()))
            return out

    def train(model, callbacks=()):
        data = [batch(model, family, seed) for seed in range(4)]
        args = TrainingArguments(
            output_dir=str(tmp_path / "out"), max_steps=4, eval_strategy="steps", eval_steps=2,
            per_device_train_batch_size=1, per_device_eval_batch_size=1, learning_rate=1e-2, seed=0,
            report_to="none", use_cpu=device == "cpu", save_strategy="no", logging_steps=1,
            dataloader_pin_memory=False,
        )  # fmt: skip
        trainer = Recorded(model=model, args=args, train_dataset=data, eval_dataset=data[:2],
                           data_collator=lambda items: items[0], callbacks=list(callbacks))  # fmt: skip
        trainer.losses = []
        trainer.train()
        return trainer.losses

    eager = load(family, device, use_kernels=False)
    model = load(family, device, use_kernels=True)
    integrations.kernelize_rotary(model, mode=Mode.TRAINING, device=device)
    per_forward = len(integrations.kernelized_layers(model))
    counts = Counts()
    ref, got = train(eager), train(model, [counts])
    assert [t for t, _ in got] == [t for t, _ in ref] and {t for t, _ in got} == {True, False}
    for (_, a), (_, b) in zip(got, ref):
        assert abs(a - b) <= TOL * abs(b), (got, ref)
    for (name, p), (_, r) in zip(model.named_parameters(), eager.named_parameters()):
        assert rel_err(p.detach(), r.detach()) < 10 * TOL, name
    # Each step: one forward of every rotary; each evaluation: two batches.
    done = dict(begin=None)
    for event, total in counts.events:
        if event == "begin":
            done["begin"] = total
        elif event == "step":
            assert total - done["begin"] == per_forward
            done["step"] = total
        else:
            assert total - done["step"] == 2 * per_forward
    assert [e for e, _ in counts.events].count("evaluate") == 2
    assert None not in integrations.kernelized_layers(model)


@pytest.mark.parametrize("device", DEVICES)
def test_models_loaded_later_keep_their_own(kernel, integrations, load, rotary_calls, device):
    """Each model holds its own copy of the rotary (kernels' use_kernelized_func): a second model
    loaded and kernelized later keeps the layer, as the first does, through train() and eval(); a
    third, loaded and not kernelized, runs transformers' function."""
    first = load("llama", device)
    integrations.kernelize_rotary(first, mode=Mode.TRAINING, device=device)
    second = load("llama", device)
    integrations.kernelize_rotary(second, mode=Mode.INFERENCE, device=device)
    third = load("llama", device)
    inputs = to(batch(first, "llama", seed=2), device)
    for model in (first, second, first, second):
        model.train()
        assert_runs_ours(kernel, model, inputs, rotary_calls)
        model.eval()
        assert_runs_ours(kernel, model, inputs, rotary_calls, backward=False)
    calls, layers, _ = forward_counts(kernel, third, inputs, rotary_calls, backward=True)
    assert calls == 0 and set(layers) == {None}


@pytest.mark.parametrize("route", ["kernelize_rotary", "kernel_config"])
@pytest.mark.parametrize("family", FAMILIES)
def test_saved_and_reloaded(kernel, integrations, load, rotary_calls, tmp_path, family, route):
    """A kernelized model trained a step, saved with save_pretrained and loaded again, kernelized
    by kernelize_rotary or loaded with kernel_config=kernel_config(): the trained weights, the
    package's layers in both modes, the same loss as the model saved."""
    model = load(family)
    integrations.kernelize_rotary(model, mode=Mode.TRAINING, device="cpu")
    model.train()
    inputs = batch(model, family, seed=3)
    assert_runs_ours(kernel, model, inputs, rotary_calls)
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    model.eval()
    want = assert_runs_ours(kernel, model, inputs, rotary_calls, backward=False)
    model.save_pretrained(tmp_path / "trained")
    cls = type(model)
    if route == "kernel_config":
        again = cls.from_pretrained(tmp_path / "trained", kernel_config=integrations.kernel_config(family))
    else:
        again = integrations.kernelize_rotary(cls.from_pretrained(tmp_path / "trained"), mode=Mode.INFERENCE)
    got = assert_runs_ours(kernel, again, inputs, rotary_calls, backward=False)
    assert rel_err(got, want) < TOL
    again.train()
    assert_runs_ours(kernel, again, inputs, rotary_calls)


@pytest.mark.parametrize("reset", RESETS)
def test_a_reset_runs_transformers_function_and_says_so_once(kernel, integrations, load, rotary_calls, reset):
    """Where transformers' own kernel management takes the layers away (another kernel_config,
    reset_kernels(), or kernels_mode=None), the model runs transformers' function (on CPU its
    mapping has no rotary), the package warns once, and kernelize_rotary puts its layers back."""
    from transformers import KernelConfig

    model = load("llama", use_kernels=True)
    integrations.kernelize_rotary(model, mode=Mode.TRAINING, device="cpu")
    inputs = batch(model, "llama", seed=4)
    assert_runs_ours(kernel, model, inputs, rotary_calls)
    if reset == "reset_kernels()":
        model.reset_kernels()
    elif reset == "kernels_mode=None":
        model.kernels_mode = None
    else:
        model.set_use_kernels(True, kernel_config=KernelConfig({}))
    with pytest.warns(UserWarning, match="rope-bwd: 2 of the 2 rotaries .* transformers' own function") as seen:
        for switch in ("train", "eval", "train"):
            getattr(model, switch)()
            calls, layers, _ = forward_counts(kernel, model, inputs, rotary_calls, backward=True)
            assert calls == 0 and layers == [None, None]
    assert sum("rope-bwd" in str(w.message) for w in seen) == 1
    integrations.kernelize_rotary(model, mode=Mode.TRAINING, device="cpu")
    assert_runs_ours(kernel, model, inputs, rotary_calls)


@pytest.mark.parametrize("first", [Mode.INFERENCE, Mode.TRAINING], ids=["inference", "training"])
@pytest.mark.parametrize("device", DEVICES)
def test_each_mode_maps_the_same_layer(kernel, integrations, load, rotary_calls, device, first):
    """Kernelized in either mode, then switched between the two (transformers kernelizes again
    at each switch, in the new mode): each call runs the package's layer (the same one in both
    modes: it has a backward, and at decode it is already faster than eager), and every gradient
    of a training call is eager transformers'."""
    eager = load("qwen3_vl", device, use_kernels=False)
    model = load("qwen3_vl", device, use_kernels=True)
    integrations.kernelize_rotary(model, mode=first, device=device)
    layers = integrations.kernelized_layers(model)
    inputs = to(batch(model, "qwen3_vl", seed=5), device)
    for switch in ("train", "eval", "train"):
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        getattr(model, switch)()
        getattr(eager, switch)()
        if model.use_kernels and hasattr(type(model), "kernels_mode"):  # transformers >= 5.25 remembers it
            assert model.kernels_mode == (Mode.TRAINING if switch == "train" else Mode.INFERENCE)
        assert_runs_ours(kernel, model, inputs, rotary_calls)
        assert integrations.kernelized_layers(model) == layers
        eager(**inputs).loss.backward()
        for (name, p), (_, r) in zip(model.named_parameters(), eager.named_parameters()):
            assert (p.grad is None) == (r.grad is None), name
            assert p.grad is None or rel_err(p.grad, r.grad) < TOL, name


def test_kernel_config_maps_every_mode_on_cpu(kernel, integrations, load, rotary_calls):
    """kernel_config() for from_pretrained: the model loads with the package's layers, on CPU too
    (transformers' own KernelConfig refuses it), and keeps them through train() and eval() (a
    KernelConfig written by hand maps the mode the model is loaded in only)."""
    config = integrations.kernel_config("qwen3_vl")
    model = load("qwen3_vl", kernel_config=config)
    assert set(config.kernel_mapping) == {"ApplyRotaryPosEmbVision", "rotary_pos_emb"}
    inputs = batch(model, "qwen3_vl", seed=6)
    for switch in ("eval", "train", "eval"):
        getattr(model, switch)()
        assert_runs_ours(kernel, model, inputs, rotary_calls, backward=switch == "train")


@pytest.mark.gpu
def test_kernel_config_written_by_hand_on_cuda(kernel, integrations, load, rotary_calls):
    """transformers' documented route, a KernelConfig naming this repository's layers, passed to
    from_pretrained on CUDA: both rotaries (the vision families' layer name registered first by
    make_kernelizable) run the package's layers."""
    from transformers import KernelConfig

    integrations.make_kernelizable(families=["qwen3_vl"])
    meta = {"version": 1, "trust_remote_code": True}
    # inherit_mapping=False: transformers' own mapping, whose CUDA kernels need the Hub, stays out
    config = KernelConfig({
        "ApplyRotaryPosEmbVision": (f"{REPO_ID}:ApplyRotaryPosEmbVision", meta),
        "rotary_pos_emb": (f"{REPO_ID}:ApplyRotaryPosEmbPromoted", meta),
    }, inherit_mapping=False)  # fmt: skip
    model = load("qwen3_vl", "cuda", kernel_config=config)
    assert_runs_ours(kernel, model, to(batch(model, "qwen3_vl", seed=7), "cuda"), rotary_calls, backward=False)


def test_deep_copies_keep_the_layers(kernel, integrations, load, rotary_calls):
    """copy.deepcopy of a kernelized loaded model (as some trainers keep an EMA twin): the copy runs
    the package's layers too, through train() and eval()."""
    model = load("llama")
    integrations.kernelize_rotary(model, mode=Mode.TRAINING, device="cpu")
    twin = copy.deepcopy(model)
    inputs = batch(model, "llama", seed=8)
    for switch in ("eval", "train"):
        getattr(twin, switch)()
        assert_runs_ours(kernel, twin, inputs, rotary_calls, backward=switch == "train")


# transformers' default hub kernels, served offline by their twins (hub_twins/README.md)

HUB_LAYERS = {
    "llama": {"rotary_pos_emb", "RMSNorm", "SiLU"},
    "qwen3_vl": {"rotary_pos_emb", "RMSNorm", "SiLU", "GeluTanh"},
}


def cuda_mapping(names) -> dict:
    """transformers' own default mapping of these layer names on CUDA: {name: {mode: repository}}."""
    from transformers.integrations.hub_kernels import get_kernel_mapping_transformers

    return {name: get_kernel_mapping_transformers()[name]["cuda"] for name in names}


def hub_rotary(hub_twins):
    """The module of the rotary twin's layer, as kernels loads it for kernels-community/rotary."""
    import kernels

    return sys.modules[kernels.get_kernel("kernels-community/rotary", version=2).layers.__name__]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_twins_serve_transformers_cuda_mapping_offline(hub_twins, hub_offline, family):
    """Every layer the test models map on CUDA (their kernel_layer_name, and the rotary's
    `rotary_pos_emb`), in every mode transformers maps it for, loads offline from a twin: the
    repository, version and layer name transformers asks for, through LOCAL_KERNELS."""
    names = {getattr(type(m), "kernel_layer_name", None) for m in make(family).modules()} - {None}
    assert names | {"rotary_pos_emb"} == HUB_LAYERS[family]
    twins = [entry.split("=", 1)[1] for entry in hub_twins.split(":")]
    for name, repos in cuda_mapping(HUB_LAYERS[family]).items():
        assert repos
        for repo in repos.values():
            layer = repo.load()
            assert layer.__name__ == repo.layer_name
            assert any(inspect.getfile(layer).startswith(twin) for twin in twins), (name, inspect.getfile(layer))


@pytest.mark.parametrize("device", DEVICES)
def test_the_hub_rotary_twin_rotates_a_copy_without_a_backward(hub_twins, gen, device):
    """kernels-community/rotary's transformers layer, as the twin has it: the rotation of
    transformers' apply_rotary_pos_emb (float64 reference), q and k left as they were, and no
    backward: the gradient passes through unrotated, far from the true one."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    layer = hub_rotary(hub_twins).apply_rotary_transformers()
    freqs = torch.randn(2, 9, 8, generator=gen)
    q, k = torch.randn(2, 4, 9, 16, generator=gen), torch.randn(2, 2, 9, 16, generator=gen)
    q, k, cos, sin = (t.to(device) for t in (q, k, torch.cat([freqs] * 2, -1).cos(), torch.cat([freqs] * 2, -1).sin()))
    before = q.clone(), k.clone()
    q.requires_grad_(), k.requires_grad_()
    got = layer(q, k, cos, sin)
    exact = [t.detach().double().requires_grad_(t.requires_grad) for t in (q, k, cos, sin)]
    want = apply_rotary_pos_emb(*exact)
    assert all(rel_err(g, w) < 1e-6 for g, w in zip(got, want))
    assert torch.equal(q.detach(), before[0]) and torch.equal(k.detach(), before[1])
    upstream = [torch.randn(t.shape, generator=gen).to(device) for t in got]
    grads = torch.autograd.grad(got, (q, k), upstream)
    true = torch.autograd.grad(want, exact[:2], [u.double() for u in upstream])
    assert all(torch.equal(g, u) for g, u in zip(grads, upstream))
    assert all(rel_err(g, t) > 0.1 for g, t in zip(grads, true))


@pytest.mark.parametrize("device", DEVICES)
def test_the_norm_and_activation_twins_compute_transformers_layers(hub_twins, gen, device):
    """The twins of LigerRMSNorm (with its backward), Silu and GeluTanh against transformers'
    layers evaluated in float64."""
    import kernels
    from transformers.activations import ACT2FN
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(24, eps=1e-6).to(device)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(24, generator=gen))
    x = torch.randn(3, 5, 24, generator=gen).to(device).requires_grad_()
    liger = kernels.get_kernel("kernels-community/liger-kernels", version=4).layers.LigerRMSNorm
    got = liger.forward(norm, x)  # as kernels runs it: the layer's forward over the replaced module
    norm64, x64 = copy.deepcopy(norm).double(), x.detach().double().requires_grad_()
    want = norm64(x64)
    assert rel_err(got, want) < 1e-6
    upstream = torch.randn(got.shape, generator=gen).to(device)
    grads = torch.autograd.grad(got, (x, norm.weight), upstream)
    true = torch.autograd.grad(want, (x64, norm64.weight), upstream.double())
    assert all(rel_err(g, t) < 1e-5 for g, t in zip(grads, true))
    activation = kernels.get_kernel("kernels-community/activation", version=1).layers
    for layer, act in ((activation.Silu, "silu"), (activation.GeluTanh, "gelu_pytorch_tanh")):
        assert rel_err(layer()(x.detach()), ACT2FN[act](x64.detach())) < 1e-6, act


def hub_kernelized(load, family, device):
    """A model trained with transformers' default hub kernels on and the package not asked for:
    on CUDA transformers' own loading (defaults, the twins serving); on the CPU, where its mapping
    has none of them, kernels.kernelize with that CUDA mapping for the CPU."""
    if device == "cuda":
        model = load(family, device)
        model.train()
        return model
    from kernels import kernelize, use_kernel_mapping

    model = load(family, device, use_kernels=False)  # transformers would kernelize again at train()
    model.train()
    # transformers 5.25 kernelizes again at train(), in training mode; 5.24 keeps what it loaded with
    mode = Mode.TRAINING if hasattr(type(model), "kernels_mode") else Mode.INFERENCE
    with use_kernel_mapping(
        {n: {"cpu": r} for n, r in cuda_mapping(HUB_LAYERS[family]).items()}, inherit_mapping=False
    ):
        kernelize(model, device="cpu", mode=mode)
    return model


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("device", DEVICES)
def test_without_kernelize_rotary_the_hub_rotary_runs_and_its_gradients_are_wrong(
    kernel, integrations, load, rotary_calls, hub_twins, monkeypatch, family, device
):
    """Loaded with transformers' hub kernels and trained without this package: the hub rotary
    runs at every rotary, the loss is eager's, and the gradients are wrong (it has no backward).
    kernelize_rotary then puts the package's layer in its place: every gradient is eager's."""
    twin = hub_rotary(hub_twins)
    hub_calls = []
    real = twin.rotate_copy
    monkeypatch.setattr(twin, "rotate_copy", lambda *a: hub_calls.append(1) or real(*a))
    eager = load(family, device, use_kernels=False)
    model = hub_kernelized(load, family, device)
    eager.train()
    inputs = to(batch(model, family, seed=9), device)

    def gradients(m):
        m.zero_grad(set_to_none=True)
        loss = m(**inputs).loss
        loss.backward()
        return loss, {n: p.grad for n, p in m.named_parameters() if p.grad is not None}

    ref_loss, ref = gradients(eager)
    loss, got = gradients(model)
    hub = len(hub_calls)  # q and k at each decoder rotary (transformers maps no vision rotary)
    assert hub and hub % 2 == 0 and sum(rotary_calls.values()) == 0
    assert rel_err(loss.detach(), ref_loss.detach()) < TOL  # the forward is right
    assert set(got) == set(ref) and max(rel_err(got[n], ref[n]) for n in ref) > 1e-2
    integrations.kernelize_rotary(model, mode=Mode.TRAINING, device=device)
    loss, got = gradients(model)
    assert len(hub_calls) == hub and sum(rotary_calls.values()) == len(integrations.kernelized_layers(model))
    assert rel_err(loss.detach(), ref_loss.detach()) < TOL
    assert all(rel_err(got[n], ref[n]) < TOL for n in ref), [n for n in ref if rel_err(got[n], ref[n]) >= TOL]


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_from_pretrained_with_transformers_defaults_on_cuda_without_the_hub(load, rotary_calls, family):
    """transformers' defaults on CUDA (its kernels on) load without the Hub: each of its default
    hub kernels the model maps is kernelized from its twin, and a forward runs."""
    from kernels import get_kernelized_layers

    assert HAS_CUDA
    model = load(family, "cuda")
    assert model.use_kernels
    found = get_kernelized_layers(model)  # the rotary is a function: under funcs, not layers
    repos = {str(k.repo) for k in (*found.layers.values(), *found.funcs.values())}
    for repo_id in ("kernels-community/rotary", "kernels-community/activation"):
        assert any(repo_id in r for r in repos), repos
    with torch.no_grad():
        assert torch.isfinite(model(**to(batch(model, family, seed=10), "cuda")).loss)
