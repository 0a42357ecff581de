"""The tune command, and the shipped configurations against what it would try (the lookup
itself: tests/test_tuning.py)."""

import itertools
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from rope_bwd_triton import REPO_ROOT, tune
from rope_bwd_triton.load import submodule

from ..helpers import HAS_CUDA, INTERPRETER_LOOPS, interpreter_runs_loops
from ..test_tuning import _clear

SEARCHED = ("BLOCK_S", "BLOCK_D", "BLOCK_R", "num_warps")
# Where the tune command runs whole: on the CPU in Triton's interpreter (CI), else on the GPU, so
# that an image whose interpreter cannot loop (Triton 3.6 under NumPy >= 2.4) runs these tests too.
TUNE_DEVICE = "cpu" if interpreter_runs_loops() else "cuda"
tunes_here = pytest.mark.skipif(TUNE_DEVICE == "cuda" and not HAS_CUDA, reason=INTERPRETER_LOOPS)


def _pow2(n):
    return n >= 1 and n & (n - 1) == 0


def _next_pow2(n):
    return 1 << max(0, (n - 1).bit_length())


@pytest.mark.cpu_only  # a function of integers
@pytest.mark.parametrize("mode", ["fwd", "bwd", "bwd_qk"])
def test_default_config_is_valid_and_fills_the_gpu(kernel, mode):
    """Every size, head_dim, rotated width, element size and SM count of the product, in one test
    per mode: each check takes microseconds, a test of its own costs more than the check."""
    default_config = submodule(kernel, "tuning").default_config
    for S, R, D, n_sm, elem in itertools.product(
        [1, 7, 128, 131, 1024, 4096, 65536], [2, 17, 32, 130], [2, 16, 72, 80, 128, 256], [132, 8, 0], [2, 4]
    ):
        where = dict(mode=mode, S=S, R=R, D=D, n_sm=n_sm, elem=elem)
        cfg = default_config(mode, S, R, D, elem, n_sm)
        half = D // 2
        assert set(cfg) == set(SEARCHED), where
        assert _pow2(cfg["BLOCK_S"]) and _pow2(cfg["BLOCK_D"]) and _pow2(cfg["BLOCK_R"]), (where, cfg)
        assert cfg["BLOCK_D"] <= _next_pow2(half), (where, cfg)
        assert 2 <= cfg["BLOCK_R"] <= max(2, _next_pow2(R)), (where, cfg)
        assert cfg["num_warps"] in (1, 2, 4, 8, 16), (where, cfg)
        programs = -(-S // cfg["BLOCK_S"]) * -(-half // cfg["BLOCK_D"])
        if n_sm == 0:  # the CPU (Triton's interpreter): 8 tokens a program, the GPU's tile otherwise
            assert cfg == {**default_config(mode, S, R, D, elem, 132), "BLOCK_S": 8}, (where, cfg)
            continue
        # a program per SM, or as many as the shape allows at 8 channels per program
        most = S * -(-half // min(8, _next_pow2(half)))
        assert programs >= min(n_sm, most), (where, cfg)
        assert tune.candidate_ok(cfg), (where, cfg)  # no tile larger than the tuner would try


def test_shipped_configs_are_valid_and_ship_in_the_build(kernel):
    tuning = submodule(kernel, "tuning")
    source = REPO_ROOT / "torch-ext" / "rope_bwd" / "configs"
    shipped = [p for p in tuning.CONFIG_DIR.iterdir() if p.name.endswith(".json")]  # a Traversable
    assert sorted(p.name for p in source.glob("*.json")) == sorted(p.name for p in shipped)
    for path in shipped:
        tables = json.loads(path.read_text())
        assert tables and all(re.fullmatch(r"\d+\.\d+", version) for version in tables), path.name
        for key, cfg in ((key, cfg) for table in tables.values() for key, cfg in table.items()):
            assert key.split("-")[0] in tuning.MODES, (path.name, key)
            D = int(re.search(r"-D(\d+)-", key).group(1))
            assert set(cfg) == set(SEARCHED), (path.name, key)
            assert _pow2(cfg["BLOCK_S"]) and _pow2(cfg["BLOCK_D"]) and cfg["BLOCK_D"] <= _next_pow2(D // 2)
            assert _pow2(cfg["BLOCK_R"]) and cfg["BLOCK_R"] >= 2, (path.name, key)
            assert cfg["num_warps"] in (1, 2, 4, 8, 16), (path.name, key)
            assert tune.candidate_ok(cfg), (path.name, key)  # the tuner would try it again


def test_tune_candidates_and_merge(tmp_path):
    assert tune.block_d_values(128) == [8, 16, 32, 64]
    assert tune.block_d_values(72) == [8, 16, 32, 64]
    assert tune.block_d_values(16) == [8]
    assert tune.block_r_values(32) == [2, 4, 8, 16, 32]
    assert tune.block_r_values(2) == [2]
    assert tune.block_r_values(5) == [2, 4, 8]
    assert {tuple(c[k] for k in SEARCHED) for c in tune.grid(16, 4)} == GRID_16
    c = dict(BLOCK_S=4, BLOCK_D=64, BLOCK_R=16, num_warps=1)
    assert not tune.candidate_ok(c)  # 64 channels per thread
    assert tune.candidate_ok({**c, "num_warps": 2}) and tune.candidate_ok({**c, "BLOCK_S": 2})
    assert tune.candidate_ok(dict(BLOCK_S=1, BLOCK_D=64, BLOCK_R=32, num_warps=1))  # 32 per thread
    assert not tune.candidate_ok(dict(BLOCK_S=8, BLOCK_D=64, BLOCK_R=32, num_warps=8))  # MAX_TILE


def test_tune_writes_into_its_tritons_table(tmp_path):
    """A table keeps its other buckets; an absent one starts from the newest older table (each
    table is complete), never from a newer one."""
    path = tmp_path / "gpu.json"
    tune.merge_write(path, {"a": {"BLOCK_S": 1}, "b": {"BLOCK_S": 2}}, "3.6")
    tune.merge_write(path, {"b": {"BLOCK_S": 4}}, "3.6")
    assert json.loads(path.read_text()) == {"3.6": {"a": {"BLOCK_S": 1}, "b": {"BLOCK_S": 4}}}
    tune.merge_write(path, {"c": {"BLOCK_S": 8}}, "3.10")
    tune.merge_write(path, {"b": {"BLOCK_S": 1}}, "3.7")
    tables = json.loads(path.read_text())
    assert list(tables) == ["3.6", "3.7", "3.10"]  # in version order
    assert tables["3.6"] == {"a": {"BLOCK_S": 1}, "b": {"BLOCK_S": 4}}
    assert tables["3.7"] == {"a": {"BLOCK_S": 1}, "b": {"BLOCK_S": 1}}
    assert tables["3.10"] == {"a": {"BLOCK_S": 1}, "b": {"BLOCK_S": 4}, "c": {"BLOCK_S": 8}}


def _tune(tmp_path, *options, device=TUNE_DEVICE):
    """Run the tune command on one bucket (bwd fp32, head_dim 16, 2+2 heads, S=5) writing into
    tmp_path (as the device's file: cpu.json, or the GPU's); returns its Triton's table and the log."""
    name = "cpu" if device == "cpu" else torch.cuda.get_device_name(device).replace(" ", "_").replace("/", "_")
    out, log = tmp_path / f"{name}.json", tmp_path / "log.json"
    cmd = [
        sys.executable,
        "-m",
        "rope_bwd_triton",
        "tune",
        "--modes",
        "bwd",
        "--dtypes",
        "float32",
        "--head-dims",
        "16",
        "--heads",
        "2",
        "--s-buckets",
        "S256",
        "--seq-lens",
        "5",
        "--calls",
        "1",
        "--device",
        device,
        "--out",
        str(out),
        "--log",
        str(log),
        *options,
    ]
    if device == "cuda" and "--jobs" not in options:  # one process: the compile workers have a test of their own
        cmd += ["--jobs", "0"]
    env = {**os.environ, "TRITON_INTERPRET": "1"} if device == "cpu" else dict(os.environ)
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tables, log = json.loads(out.read_text()), json.loads(log.read_text())
    assert list(tables) == [log["triton"]]  # the installed Triton's table, in a new file
    return tables[log["triton"]], log


BUCKET = ("bwd", 5, 4, 16, 4)  # tuning.bucket() arguments of _tune's bucket
# every candidate of that bucket: head_dim 16 has one BLOCK_D value (8), 2+2 heads two BLOCK_R values
GRID_16 = {(bs, 8, br, w) for bs in tune.BLOCK_S for br in (2, 4) for w in tune.NUM_WARPS}


@tunes_here
def test_tune_command_writes_a_table_the_package_reads(kernel, monkeypatch, tmp_path):
    """The whole tune path (on the CPU in Triton's interpreter, timings meaningless, or on the GPU:
    TUNE_DEVICE); the package then finds the written bucket. One command (an interpreted one takes
    tens of seconds) covers the options: the coordinate search with --shared, the span timer's
    code path (its log names the keys written) and --layout sdpa, which times the backward on
    upstream gradients laid out as sdpa returns them and writes the bucket's entry for that layout
    (test_layout_entries_take_precedence_and_fall_back: how the package reads it). The grid
    search: test_tune_on_a_gpu_compiles_the_grid_in_worker_processes_first."""
    table, log = _tune(tmp_path, "--shared", "--timer", "span", "--layout", "sdpa")
    t = submodule(kernel, "tuning")
    key = t.bucket(*BUCKET, "sdpa")
    assert list(table) == [key] and set(table[key]) == set(SEARCHED) and key.endswith("-sdpa")
    assert log["buckets"][key]["tried"] and not log["not_tuned"] and "precompile" not in log
    assert log["buckets"][key]["written_to"] == [key]
    assert log["meta"]["command"].startswith("python -m rope_bwd_triton tune ")
    assert (log["meta"]["gpu"] is None) == (TUNE_DEVICE == "cpu")

    monkeypatch.setattr(t, "CONFIG_DIR", tmp_path)
    _clear(t)
    try:
        assert t.get_config("bwd", 5, 2, 2, 16, 4, torch.device(TUNE_DEVICE), "sdpa") == table[key]
    finally:
        _clear(t)


def test_shared_search_writes_to_the_bucket_of_every_size(kernel):
    """--shared: the winner of one search over the sizes of several buckets goes under each
    bucket's key, so that those sizes share one compiled kernel; without it, under the first's."""
    sizes = (256, 1024, 2213, 4096, 16384, 65536)
    keys = tune.target_keys(submodule(kernel, "tuning"), "bwd_qk", sizes, 32, 72, 2, "sdpa", True)
    assert keys == [f"bwd_qk-D72-R32-b2-{b}-sdpa" for b in ("S256", "S1024", "S4096", "S16384", "Sbig")]
    assert tune.target_keys(submodule(kernel, "tuning"), "bwd_qk", sizes, 32, 72, 2, "", False) == [
        "bwd_qk-D72-R32-b2-S256"
    ]


@pytest.mark.gpu
def test_tune_on_a_gpu_compiles_the_grid_in_worker_processes_first(kernel, tmp_path):
    """--jobs: worker processes compile every candidate before the search, which then
    checks and times each of them in the parent process."""
    table, log = _tune(tmp_path, "--grid", "--jobs", "2", device="cuda")
    key = submodule(kernel, "tuning").bucket(*BUCKET)
    assert log["precompile"]["compiled"] == log["precompile"]["candidates"] == len(GRID_16)
    tried = log["buckets"][key]["tried"]
    assert GRID_16 <= {tuple(c[k] for k in SEARCHED) for c in tried}
    assert all(c["score"] is not None for c in tried)  # each one passed the float64 check
    assert tuple(table[key][k] for k in SEARCHED) in GRID_16
