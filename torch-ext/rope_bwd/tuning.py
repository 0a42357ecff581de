"""Launch configurations for the rotary kernel.

Tuned configurations ship as JSON in configs/, one file per GPU name
(`configs/<device name, spaces as _>.json`), each mapping a shape bucket (see
`bucket`) to {BLOCK_S, BLOCK_D, BLOCK_R, num_warps}. Unknown GPUs and buckets get the
heuristic `default_config`. Nothing is autotuned at a user's call.
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


def s_bucket(S: int) -> str:
    for top in (256, 1024, 4096, 16384):
        if S <= top:
            return f"S{top}"
    return "Sbig"


def bucket(mode: str, S: int, R: int, D: int, elem_size: int) -> str:
    """Key of a tuned configuration: mode, head_dim, rows (q heads + k heads), element bytes, S bucket."""
    return f"{mode}-D{D}-R{R}-b{elem_size}-{s_bucket(S)}"


def device_file(device_name: str) -> Path:
    return CONFIG_DIR / (device_name.replace(" ", "_").replace("/", "_") + ".json")


@functools.lru_cache(maxsize=None)
def tuned_table(device_name: str) -> dict:
    path = device_file(device_name)
    return json.loads(path.read_text()) if path.exists() else {}


def default_config(S: int, R: int, D: int, elem_size: int, n_sm: int = 132) -> dict:
    """Heuristic from an H200 sweep: one warp per program, one token, whole half rows
    of up to 64 channels, 16 (fp32) or 8 (16-bit) q+k heads per chunk. With too few
    programs to fill the GPU, the half row is split and all heads go in one chunk, so
    that each program has all its loads in flight at once."""
    half = D // 2
    bd = min(_next_pow2(half), 64)
    while bd > 16 and S * _cdiv(half, bd) < 4 * n_sm:
        bd //= 2
    few = S * _cdiv(half, bd) < 8 * n_sm
    br = min(_next_pow2(max(R, 2)), 32 if few else 16 if elem_size >= 4 else 8)
    return {"BLOCK_S": 1, "BLOCK_D": bd, "BLOCK_R": br, "num_warps": 1}


@functools.lru_cache(maxsize=None)
def _device_props(device: torch.device):
    if device.type != "cuda":
        return "cpu", 1
    props = torch.cuda.get_device_properties(device)
    return props.name, props.multi_processor_count


def config_for(mode: str, S: int, HQ: int, HK: int, D: int, elem_size: int, device: torch.device) -> dict:
    """Full launch configuration (block sizes and warps) for one call."""
    name, n_sm = _device_props(device)
    R = HQ + HK
    return tuned_table(name).get(bucket(mode, S, R, D, elem_size)) or default_config(S, R, D, elem_size, n_sm)
