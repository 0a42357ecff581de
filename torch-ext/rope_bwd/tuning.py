"""Launch configurations for the rotary kernel.

Tuned configurations ship as JSON in configs/, one file per GPU name
(`configs/<device name, spaces as _>.json`), each mapping a shape bucket, and for some
backward buckets a layout (see `bucket`), to {BLOCK_S, BLOCK_D, BLOCK_R, num_warps}; and
`<device name>.from-triton-3.7.json`, entries for Triton 3.7 and later that override those.
Unknown GPUs and buckets get the heuristic `default_config`. Nothing is autotuned at a
user's call.
"""

import functools
import json
from pathlib import Path

import torch

CONFIG_DIR = Path(__file__).parent / "configs"
MODES = ("fwd", "bwd", "bwd_qk")  # forward; backward with table gradient; backward of q/k only


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


BUCKET_TOPS = (256, 1024, 4096, 16384)  # S buckets: S <= each top, then "Sbig"
BIG = 65536  # the S that stands for "Sbig" where a configuration is computed


def s_bucket(S: int) -> str:
    for top in BUCKET_TOPS:
        if S <= top:
            return f"S{top}"
    return "Sbig"


def bucket_size(bucket: str) -> int:
    """The S a bucket's configuration is chosen for: its largest (Sbig: BIG). Every S of a
    bucket gets the same configuration, so a new S compiles no new kernel."""
    return BIG if bucket == "Sbig" else int(bucket[1:])


def bucket(mode: str, S: int, R: int, D: int, elem_size: int, layout: str = "") -> str:
    """Key of a tuned configuration: mode, head_dim, rows (q heads + k heads), element bytes, S
    bucket, and the layout where it has entries of its own: "sdpa" for a backward whose upstream
    gradient has its heads outside its tokens, as sdpa returns it ([1, H, S, D] seen as [S, H, D])."""
    key = f"{mode}-D{D}-R{R}-b{elem_size}-{s_bucket(S)}"
    return f"{key}-{layout}" if layout else key


LATER_TRITON = "from-triton-3.7"  # names the tables of entries for Triton 3.7 and later (see tuned_table)


def device_file(device_name: str, later_triton: bool = False) -> Path:
    stem = device_name.replace(" ", "_").replace("/", "_")
    return CONFIG_DIR / (f"{stem}.{LATER_TRITON}.json" if later_triton else f"{stem}.json")


def later_triton() -> bool:
    """Whether this Triton is 3.7 or later, which lays out the kernel's tiles otherwise than
    3.6 and before (rotary_triton._REGS_FIRST), so that some shapes want other configurations."""
    try:
        from .rotary_triton import _REGS_FIRST
    except ImportError:  # no Triton: nothing is launched
        return False
    return _REGS_FIRST


@functools.cache
def tuned_table(device_name: str) -> dict:
    """The GPU's table; with Triton 3.7 and later, its entries for those versions override."""
    table = {}
    for path in [device_file(device_name)] + ([device_file(device_name, True)] if later_triton() else []):
        table.update(json.loads(path.read_text()) if path.exists() else {})
    return table


def default_config(mode: str, S: int, R: int, D: int, elem_size: int, n_sm: int = 132) -> dict:
    """Heuristic from a block-size sweep (benchmarks/NOTES.md, "Default configuration"): one
    token per program; half rows of up to 64 channels.
    - Few programs (S * channel blocks < 16 per SM in fp32, < 4 in 16-bit types, whose rows
      are half as long): 32 channels and all heads (up to 32 q+k) in one chunk on one warp, so
      that each program has all its loads in flight at once; the half row is split further
      only to give every SM a program (more, smaller programs measured slower).
    - Many programs: 64 channels; 16 heads per chunk on one warp for the backward with a
      table gradient (twice the loads per head), else 32 heads on two warps."""
    half = D // 2
    bd = min(_next_pow2(half), 64)
    rows = min(_next_pow2(max(R, 2)), 32)
    if S * _cdiv(half, bd) < (16 if elem_size >= 4 else 4) * n_sm:
        bd = min(bd, 32)
        while bd > 8 and S * _cdiv(half, bd) < n_sm:
            bd //= 2
        return {"BLOCK_S": 1, "BLOCK_D": bd, "BLOCK_R": rows, "num_warps": 1}
    if mode == "bwd":
        return {"BLOCK_S": 1, "BLOCK_D": bd, "BLOCK_R": min(rows, 16), "num_warps": 1}
    return {"BLOCK_S": 1, "BLOCK_D": bd, "BLOCK_R": rows, "num_warps": 2}


@functools.cache
def _device_props(device: torch.device):
    if device.type != "cuda":
        return "cpu", 1
    props = torch.cuda.get_device_properties(device)
    return props.name, props.multi_processor_count


def config_for(
    mode: str, S: int, HQ: int, HK: int, D: int, elem_size: int, device: torch.device, layout: str = ""
) -> dict:
    """Full launch configuration (block sizes and warps) for one call: the tuned one of its
    bucket and layout, else of its bucket, else default_config at the bucket's size."""
    return _bucket_config(mode, s_bucket(S), HQ, HK, D, elem_size, device, layout)


def _bucket_config(mode, s_bucket_, HQ, HK, D, elem_size, device, layout=""):
    return gpu_config(*_device_props(device), mode, s_bucket_, HQ, HK, D, elem_size, layout)


def gpu_config(name, n_sm, mode, s_bucket_, HQ, HK, D, elem_size, layout=""):
    """The configuration of an S bucket on the GPU named `name` (with n_sm SMs), which need not
    be this machine's: the tuned one of its bucket and layout, else of its bucket, else
    default_config at the bucket's size."""
    R, S = HQ + HK, bucket_size(s_bucket_)
    table = tuned_table(name)
    return (
        (layout and table.get(bucket(mode, S, R, D, elem_size, layout)))
        or table.get(bucket(mode, S, R, D, elem_size))
        or default_config(mode, S, R, D, elem_size, n_sm)
    )


# _bucket_config per call shape for the launch path, where its lookups are host time per call;
# keyed by bucket, not S, so that it does not grow with the number of sizes. It is computed
# once per shape and process; tuned_table.cache_clear() does not reset it.
_cached_bucket_config = functools.lru_cache(maxsize=4096)(_bucket_config)


def cached_config(
    mode: str, S: int, HQ: int, HK: int, D: int, elem_size: int, device: torch.device, layout: str = ""
) -> dict:
    return _cached_bucket_config(mode, s_bucket(S), HQ, HK, D, elem_size, device, layout)
