"""Launch configurations of the rotary kernel: tuned ones shipped as JSON, a default for the rest.

`configs/<GPU name, spaces as _>.json` maps a Triton version ("3.6") to a table {bucket: {BLOCK_S,
BLOCK_D, BLOCK_R, num_warps}} (`bucket`), written by the toolkit's `tune` on that GPU. A Triton
uses the table of the newest version key not above its own (tile layouts change between
releases). Unknown GPUs, versions and buckets get `default_config`; nothing is autotuned at a
user's call. The files are read as package resources (kernels' zip layout finds them too).
ROPE_BWD_TUNED=0 in the environment (read at import) sets the tables aside (the bench's --untuned).
"""

import functools
import importlib.resources
import json
import os
import re

import torch

CONFIG_DIR = importlib.resources.files(__package__) / "configs"
MODES = ("fwd", "bwd", "bwd_qk")  # forward; backward with the table gradient; backward of q/k only
BUCKET_TOPS = (256, 1024, 4096, 16384)  # S buckets: S <= each top, then "Sbig"
TUNED = os.environ.get("ROPE_BWD_TUNED", "1") != "0"


def s_bucket(S: int) -> str:
    return next((f"S{top}" for top in BUCKET_TOPS if S <= top), "Sbig")


def bucket_size(bucket: str) -> int:
    """The S a bucket's configuration is chosen for, its largest: every S of a bucket gets the
    same configuration, so a new S compiles no new kernel."""
    return 65536 if bucket == "Sbig" else int(bucket[1:])  # "Sbig" stands for S = 65536


def bucket(mode: str, S: int, R: int, D: int, elem_size: int, layout: str = "") -> str:
    """A table's key: mode, rotated channels D, rows R (q + k heads), element bytes, S bucket, and
    the layout where it has entries of its own ("sdpa": an upstream gradient's heads outside its tokens)."""
    key = f"{mode}-D{D}-R{R}-b{elem_size}-{s_bucket(S)}"
    return f"{key}-{layout}" if layout else key


def triton_version() -> str:
    """major.minor of the installed Triton ("0.0" without one)."""
    try:
        import triton
    except ImportError:
        return "0.0"
    return ".".join(re.findall(r"\d+", triton.__version__)[:2])


def version_tuple(v: str) -> tuple:
    return tuple(int(n) for n in v.split("."))


def config_file(device_name: str):
    """The GPU's file (an importlib.resources Traversable: a path, or a member of the zip)."""
    return CONFIG_DIR / (device_name.replace(" ", "_").replace("/", "_") + ".json")


@functools.cache
def tuned_table(device_name: str, version: str) -> dict:
    """The table of the newest version key of the GPU's file not above `version`; {} if none."""
    path = config_file(device_name)
    tables = json.loads(path.read_text()) if path.is_file() else {}
    keys = [v for v in tables if version_tuple(v) <= version_tuple(version)]
    return tables[max(keys, key=version_tuple)] if keys else {}


def default_config(mode: str, S: int, R: int, D: int, elem_size: int, n_sm: int = 132) -> dict:
    """One token per program, half rows of up to 64 channels.
    - Few programs (S * channel blocks < 16 per SM in 4-byte types, < 4 in 2-byte types): 32
      channels and every head (up to 32 q + k) in one chunk on one warp, so that a program has
      all its loads in flight; the half row is split further only to give every SM a program.
    - Many programs: 64 channels; 16 heads per chunk on one warp for the backward with the table
      gradient (twice the loads per head), else 32 heads on two warps.
    - No SMs (CPU tensors in Triton's interpreter, which runs the programs one after another at
      about the same cost whatever their tile): 8 tokens per program."""
    if n_sm == 0:
        return {**default_config(mode, S, R, D, elem_size), "BLOCK_S": 8}
    half = D // 2
    bd = min(triton_next_pow2(half), 64)
    rows = min(triton_next_pow2(max(R, 2)), 32)
    blocks = -(-half // bd)
    if S * blocks < (16 if elem_size >= 4 else 4) * n_sm:
        bd = min(bd, 32)
        while bd > 8 and S * -(-half // bd) < n_sm:
            bd //= 2
        return {"BLOCK_S": 1, "BLOCK_D": bd, "BLOCK_R": rows, "num_warps": 1}
    if mode == "bwd":
        return {"BLOCK_S": 1, "BLOCK_D": bd, "BLOCK_R": min(rows, 16), "num_warps": 1}
    return {"BLOCK_S": 1, "BLOCK_D": bd, "BLOCK_R": rows, "num_warps": 2}


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.cache
def _device_props(device: torch.device):
    if device.type != "cuda":
        return "cpu", 0
    props = torch.cuda.get_device_properties(device)
    return props.name, props.multi_processor_count


@functools.lru_cache(maxsize=4096)
def _lookup(mode, bucket_, HQ, HK, D, elem_size, device, layout):
    name, n_sm = _device_props(device)
    R, S = HQ + HK, bucket_size(bucket_)
    table = tuned_table(name, triton_version()) if TUNED else {}
    return (
        (layout and table.get(bucket(mode, S, R, D, elem_size, layout)))
        or table.get(bucket(mode, S, R, D, elem_size))
        or default_config(mode, S, R, D, elem_size, n_sm)
    )


def get_config(mode: str, S: int, HQ: int, HK: int, D: int, elem_size: int, device, layout: str = "") -> dict:
    """The tuned configuration of the call's bucket and layout, else of its bucket, else
    default_config at the bucket's size; cached by bucket, not S. D: the rotated channels."""
    return _lookup(mode, s_bucket(S), HQ, HK, D, elem_size, device, layout)
