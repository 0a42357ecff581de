"""One training step of the kernelized Qwen3-Omni vision encoder under DDP and then FSDP2,
each rank on images of its own sizes; run by tests/toolkit/test_multi_gpu.py through torchrun:

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/toolkit/dist_kernelized_encoder.py \
        --device cpu|cuda --out DIR

(cpu: gloo and the kernel's CPU path; cuda: NCCL, one GPU per rank). The kernel loads as
users load it (kernels.get_kernel; LOCAL_KERNELS set by the test) and is kernelized from
this checkout's build. Writes DIR/<wrap>-rank<r>.pt: the rank's outputs and how often the
kernel's rotary ran forward and backward; rank 0 also the full gradient of every parameter."""

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from rope_bwd_triton import REPO_ROOT, models  # noqa: E402
from rope_bwd_triton.load import load_kernel  # noqa: E402

FAMILY = "qwen3_omni_moe"
# Per rank: images of different sizes and counts (t, h, w patches; h, w even: spatial merge 2).
GRIDS = [[[1, 4, 8]], [[1, 8, 8], [1, 4, 4]]]


def images(model, rank):
    return models.make_images(model, GRIDS[rank], seed=100 + rank)


def kernelized_model(kernel, device):
    from kernels import KernelizeFallback, LocalLayerRepository, Mode, kernelize, use_kernel_mapping

    model = models.make_vision_model(FAMILY, device=device, **models.QUICK_OMNI)
    integrations = kernel.integrations
    integrations.make_kernelizable(model)
    repo = LocalLayerRepository(repo_path=Path(REPO_ROOT), layer_name=integrations.LAYER_NAME)
    # Raise on any failure of ours; layers of transformers' own that this mapping does not name
    # (GeluTanh, with kernels >= 0.19) keep their forward.
    with use_kernel_mapping({integrations.LAYER_NAME: {device.type: repo}}):
        model = kernelize(model, mode=Mode.TRAINING, device=device.type, use_fallback=KernelizeFallback.NO_LAYER)
    funcs = [f for m in model.modules() for f in m.__dict__.get("_kernel_funcs", {}).values()]
    assert funcs and all(f.forward.__func__ is kernel.layers.ApplyRotaryPosEmbVision.forward for f in funcs)
    return model


def counting(kernel):
    """Counts the kernelized layer's calls of the kernel's rotary (each layer's forward calls
    layers.py's rotary_call once), and the gradients that reach their outputs: from there the
    backward is the kernel's."""
    counts = {"fwd": 0, "bwd": 0}
    rotary = kernel.layers.rotary_call

    def backward_reached(grad):
        counts["bwd"] += 1

    def counted(*args, **options):
        counts["fwd"] += 1
        q_embed, k_embed = rotary(*args, **options)
        if q_embed.requires_grad:
            q_embed.register_hook(backward_reached)
        return q_embed, k_embed

    kernel.layers.rotary_call = counted
    return counts


def wrapped(model, wrap, device):
    if wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None), model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, model


def full_grads(model):
    """name -> the whole gradient (FSDP2's are sharded DTensors), on the CPU; None if unused."""
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()
        grads[name] = None if g is None else g.detach().cpu()
    return grads


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        # fp32 means fp32: the reference is computed without TF32 too
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    kernel = load_kernel(build=False)
    counts = counting(kernel)
    for wrap in ("ddp", "fsdp2"):
        counts.update(fwd=0, bwd=0)
        net, model = wrapped(kernelized_model(kernel, device), wrap, device)
        out, loss = models.step(net, *images(model, rank))
        loss.backward()
        out = list(models.output_tensors(out))
        grads = full_grads(model)  # collective under FSDP2: every rank takes part
        result = {"outputs": [o.detach().cpu() for o in out], "counts": dict(counts)}
        if rank == 0:
            result["grads"] = grads
        torch.save(result, args.out / f"{wrap}-rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
