"""More than one device: tensors on cuda:1 while cuda:0 is current, and a training step of
the kernelized Qwen3-Omni vision encoder under DDP and FSDP2 (torchrun, two processes,
images of other sizes on each rank), whose outputs and gradients must match a
single-process eager run of transformers on all the images. The distributed test runs
on two GPUs (NCCL) and, to prove the harness on any machine, on the CPU (gloo, the
kernel's CPU path). Tests that need two GPUs skip with fewer."""

import inspect
import os
import subprocess
import sys

import pytest
import torch

from rope_bwd_triton import REPO_ROOT, models, suite

from ..helpers import HAS_CUDA

TWO_GPUS = HAS_CUDA and torch.cuda.device_count() >= 2
needs_two_gpus = pytest.mark.skipif(not TWO_GPUS, reason="needs 2 CUDA GPUs")
WORKER = REPO_ROOT / "tests" / "toolkit" / "dist_kernelized_encoder.py"
sys.path.insert(0, str(WORKER.parent))
import dist_kernelized_encoder as worker  # noqa: E402

FP32_TOL = 2e-6
# The kernel's rotary against transformers' through the tiny encoder, fp32: the CPU run lands
# near 1e-7 (outputs bit-exact); on CUDA the reductions of two processes and of NCCL differ
# from one process's, as in tests/toolkit/test_kernelize_transformers.py's fp32 parity on CUDA.
STEP_TOL = {"cpu": 1e-6, "cuda": 1e-5}


# ------------------------------------------------------------- a second GPU


@pytest.mark.gpu
@needs_two_gpus
def test_tensors_on_the_second_gpu(kernel, gen):
    """Every public function on cuda:1 tensors with cuda:0 current: right results, on cuda:1,
    and cuda:0 stays current (the launch switches device and back)."""
    torch.cuda.set_device(0)
    S, HQ, HK, D = 37, 4, 3, 72
    cpu = [torch.randn(S, h, D, generator=gen) for h in (HQ, HK, HQ, HK)] + [torch.randn(S, D, generator=gen)]
    gq, gk, q, k, e = (t.to("cuda:1") for t in cpu)
    ref = suite.reference_backward(*cpu)
    got = kernel.rope_bwd(gq, gk, q, k, e)
    out = tuple(torch.full_like(t, float("nan")) for t in (q, k, e))
    kernel.rope_bwd(gq, gk, q, k, e, out=out)
    for results in (got, out):
        for g, r in zip(results, ref):
            assert g.device == torch.device("cuda:1") and suite.rel_err(g, r) <= FP32_TOL
    fwd_ref = suite.reference_forward(*(t.double() for t in cpu[2:]))
    for g, r in zip(kernel.rope_fwd(q, k, e), fwd_ref):
        assert g.device == torch.device("cuda:1") and suite.rel_err(g, r) <= FP32_TOL
    leaves = [t.clone().requires_grad_() for t in (q, k, e.cos(), e.sin())]
    torch.autograd.backward(kernel.apply_rotary_pos_emb_vision(*leaves), (gq, gk))
    for leaf, r in zip(leaves[:2], ref[:2]):
        assert leaf.grad.device == torch.device("cuda:1") and suite.rel_err(leaf.grad, r) <= FP32_TOL
    torch.cuda.synchronize("cuda:1")
    assert torch.cuda.current_device() == 0


@pytest.mark.gpu
@needs_two_gpus
def test_cuda0_tensors_under_the_second_gpu(kernel, gen):
    """The other way round: cuda:0 tensors while cuda:1 is current."""
    S, H, D = 19, 2, 80
    cpu = [torch.randn(S, H, D, generator=gen) for _ in range(4)] + [torch.randn(S, D, generator=gen)]
    with torch.cuda.device(1):
        got = kernel.rope_bwd(*(t.to("cuda:0") for t in cpu))
        assert torch.cuda.current_device() == 1
    for g, r in zip(got, suite.reference_backward(*cpu)):
        assert g.device == torch.device("cuda:0") and suite.rel_err(g, r) <= FP32_TOL


# ------------------------------------------------- DDP and FSDP2 under torchrun


def _reference(device):
    """Single process, transformers' eager rotary: outputs per rank, and the gradients of the
    mean of the ranks' losses (what DDP and FSDP2 average)."""
    modeling = models.modeling_module(worker.FAMILY)
    assert inspect.isfunction(modeling.apply_rotary_pos_emb_vision), "transformers' rotary is patched"
    model = models.make_vision_model(worker.FAMILY, device=device, **models.QUICK_OMNI)
    outputs, total = [], 0
    for rank in range(len(worker.GRIDS)):
        out, loss = models.step(model, *worker.images(model, rank))
        outputs.append([o.detach().cpu() for o in models.output_tensors(out)])
        total = total + loss / len(worker.GRIDS)
    total.backward()
    return outputs, {n: None if p.grad is None else p.grad.cpu() for n, p in model.named_parameters()}


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_two_gpus])])
def distributed_run(request, kernel, tmp_path_factory):
    """torchrun of the worker on two processes: its result files, and the reference."""
    device = request.param
    out = tmp_path_factory.mktemp(f"dist-{device}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(WORKER),
            "--device",
            device,
            "--out",
            str(out),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if device == "cuda":  # fp32 means fp32, as in the workers
        saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        ref = _reference(device)
    finally:
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    return out, ref, STEP_TOL[device]


@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_kernelized_encoder_distributed(distributed_run, wrap):
    out, (ref_outputs, ref_grads), tol = distributed_run
    ranks = [torch.load(out / f"{wrap}-rank{r}.pt") for r in range(len(worker.GRIDS))]
    for rank, result in enumerate(ranks):
        assert result["counts"]["fwd"] > 0 and result["counts"]["bwd"] > 0, f"rank {rank}: the kernel did not run"
        assert len(result["outputs"]) == len(ref_outputs[rank])
        for i, (o, r) in enumerate(zip(result["outputs"], ref_outputs[rank])):
            assert o.shape == r.shape and suite.rel_err(o, r) < tol, f"rank {rank} output {i}"
    grads = ranks[0]["grads"]
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        r = ref_grads[name]
        assert (g is None) == (r is None), name
        assert g is None or suite.rel_err(g, r) < tol, f"grad of {name}: rel err {suite.rel_err(g, r):.2e}"
