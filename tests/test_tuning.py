"""Launch-configuration lookup (tuning.py): tuned JSON per GPU name, Triton version, bucket and
layout; the default for unknown GPUs, versions and buckets; one configuration per S bucket."""

import json
import os
import subprocess
import sys

import pytest
import torch

from .helpers import REPO_ID, submodule


@pytest.fixture
def tuning(kernel, monkeypatch, tmp_path):
    """The loaded package's tuning module, reading configs from tmp_path, on a GPU named 'Fake GPU 9000'."""
    t = submodule(kernel, "tuning")
    monkeypatch.setattr(t, "CONFIG_DIR", tmp_path)
    monkeypatch.setattr(t, "_device_props", lambda device: ("Fake GPU 9000", 132))
    _clear(t)
    yield t
    _clear(t)  # the launch path's cache must not keep this fake GPU's entries for later tests


def _clear(tuning):
    tuning.tuned_table.cache_clear()
    tuning._lookup.cache_clear()


def _write(tuning, tables):
    tuning.config_file("Fake GPU 9000").write_text(json.dumps(tables))


def test_symbolic_seq_len_picks_the_config_of_its_hint_without_a_guard(kernel):
    """Under torch.compile with S dynamic, the launch configuration is the one of the S the
    trace saw (every configuration is correct for every S); asking adds no guard."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    launch = submodule(kernel, "launch")
    env = ShapeEnv()
    S = env.create_symintnode(env.create_symbol(4097, ConstantSource("S")), hint=4097)
    assert launch._size_hint(S) == 4097 and launch._size_hint(4097) == 4097
    assert not env.guards
    assert launch._size_hint(env.create_unbacked_symint()) == 4096  # data-dependent: no hint


def test_tuned_config_is_looked_up_by_gpu_name_and_bucket(tuning, tmp_path):
    S, H, D = 2213, 16, 128
    tuned = {"BLOCK_S": 2, "BLOCK_D": 16, "BLOCK_R": 4, "num_warps": 2}
    key = tuning.bucket("bwd", S, 2 * H, D, 4)
    assert tuning.config_file("Fake GPU 9000") == tmp_path / "Fake_GPU_9000.json"
    _write(tuning, {tuning.triton_version(): {key: tuned}})

    assert tuning.get_config("bwd", S, H, H, D, 4, torch.device("cpu")) == tuned
    # another S of the same bucket shares the entry; another dtype is another bucket
    assert tuning.get_config("bwd", 4096, H, H, D, 4, torch.device("cpu")) == tuned
    assert tuning.get_config("bwd", S, H, H, D, 2, torch.device("cpu")) == tuning.default_config(
        "bwd", 4096, 2 * H, D, 2, 132
    )


def test_layout_entries_take_precedence_and_fall_back(tuning):
    """A bucket's entry for sdpa's gradient layout serves that layout; a bucket without one
    serves it the layout-free entry; other layouts never see it."""
    H, D = 16, 72
    generic = {"BLOCK_S": 1, "BLOCK_D": 64, "BLOCK_R": 32, "num_warps": 2}
    sdpa = {"BLOCK_S": 2, "BLOCK_D": 64, "BLOCK_R": 32, "num_warps": 4}
    table = {tuning.bucket("bwd_qk", S, 2 * H, D, 2): generic for S in (1024, 4096)}
    table[tuning.bucket("bwd_qk", 4096, 2 * H, D, 2, "sdpa")] = sdpa
    assert tuning.bucket("bwd_qk", 4096, 2 * H, D, 2, "sdpa") == "bwd_qk-D72-R32-b2-S4096-sdpa"
    _write(tuning, {tuning.triton_version(): table})
    cpu = torch.device("cpu")
    assert tuning.get_config("bwd_qk", 3000, H, H, D, 2, cpu, "sdpa") == sdpa
    assert tuning.get_config("bwd_qk", 3000, H, H, D, 2, cpu) == generic
    assert tuning.get_config("bwd_qk", 1000, H, H, D, 2, cpu, "sdpa") == generic


@pytest.mark.parametrize(
    "version,table", [("3.5", None), ("3.6", "3.6"), ("3.8", "3.7"), ("3.9", "3.9"), ("3.10", "3.9"), ("4.0", "3.9")]
)
def test_a_triton_reads_the_newest_table_not_above_its_version(tuning, monkeypatch, version, table):
    """Tile layouts change between Triton releases: each table serves its version and the later
    ones up to the next table; a Triton older than every table gets the default."""
    H, D = 16, 72
    key = tuning.bucket("bwd_qk", 4096, 2 * H, D, 2)
    tables = {v: {key: {"BLOCK_S": 1, "BLOCK_D": 64, "BLOCK_R": 32, "num_warps": w}} for v, w in
              (("3.6", 1), ("3.7", 2), ("3.9", 4))}  # fmt: skip
    _write(tuning, tables)
    monkeypatch.setattr(tuning, "triton_version", lambda: version)
    got = tuning.get_config("bwd_qk", 4000, H, H, D, 2, torch.device("cpu"))
    assert got == (tables[table][key] if table else tuning.default_config("bwd_qk", 4096, 2 * H, D, 2, 132))


def test_triton_version_is_the_installed_major_minor(kernel):
    import triton

    assert submodule(kernel, "tuning").triton_version() == ".".join(triton.__version__.split(".")[:2])


@pytest.mark.kernels_ci
@pytest.mark.parametrize("elem", [2, 4])
@pytest.mark.parametrize("mode", ["fwd", "bwd", "bwd_qk"])
def test_one_config_per_bucket(tuning, mode, elem):
    """Without a tuned entry too, every S of a bucket gets the bucket's configuration (its
    largest S's default), so that a new S never compiles a new kernel."""
    configs = {}
    for S in range(1, 20000, 37):
        cfg = tuning.get_config(mode, S, 16, 16, 72, elem, torch.device("cpu"))
        configs.setdefault(tuning.s_bucket(S), set()).add(tuple(cfg.items()))
    assert all(len(c) == 1 for c in configs.values()) and len(configs) == 5
    assert configs["S256"] == {tuple(tuning.default_config(mode, 256, 32, 72, elem, 132).items())}


@pytest.mark.parametrize("case", ["unknown GPU", "unknown bucket"])
def test_falls_back_to_default_config(tuning, case):
    S, H, D = 1024, 16, 72
    if case == "unknown bucket":
        other = tuning.bucket("fwd", S, 2 * H, 128, 4)
        _write(tuning, {tuning.triton_version(): {other: {"BLOCK_S": 8, "BLOCK_D": 8, "BLOCK_R": 2, "num_warps": 1}}})
    cfg = tuning.get_config("bwd", S, H, H, D, 4, torch.device("cpu"))
    assert cfg == tuning.default_config("bwd", tuning.bucket_size(tuning.s_bucket(S)), 2 * H, D, 4, 132)


def test_tuned_table_is_the_newest_version_not_above_triton(kernel, tmp_path, monkeypatch):
    """A GPU's file maps Triton versions to tables: a Triton takes the newest key not above its
    own major.minor (compared as numbers: 3.10 is after 3.9), none below the oldest key."""
    tuning = submodule(kernel, "tuning")
    tables = {v: {f"fwd-D72-R32-b2-S256-{v}": {"BLOCK_S": 1}} for v in ("3.6", "3.7", "3.10")}
    monkeypatch.setattr(tuning, "CONFIG_DIR", tmp_path)
    tuning.config_file("Some GPU/X").write_text(json.dumps(tables))
    assert tuning.config_file("Some GPU/X").name == "Some_GPU_X.json"
    tuning.tuned_table.cache_clear()
    try:
        for version, want in (("3.5", None), ("3.6", "3.6"), ("3.8", "3.7"), ("3.9", "3.7"), ("3.10", "3.10")):
            assert tuning.tuned_table("Some GPU/X", version) == tables.get(want, {}), version
        assert tuning.tuned_table("Another GPU", "3.7") == {}
    finally:
        tuning.tuned_table.cache_clear()


def test_untuned_switch_sets_the_shipped_tables_aside(kernel, monkeypatch):
    """tuning.TUNED False (ROPE_BWD_TUNED=0): a GPU that has a table for this Triton gets
    default_config for every bucket of it, as the bench's --untuned measures."""
    tuning = submodule(kernel, "tuning")
    monkeypatch.setattr(tuning, "_device_props", lambda device: ("NVIDIA H200", 132))
    table = tuning.tuned_table("NVIDIA H200", tuning.triton_version())
    assert table, "no H200 table for this Triton: the case is not exercised"
    cpu = torch.device("cpu")
    try:
        for tuned in (True, False):
            monkeypatch.setattr(tuning, "TUNED", tuned)
            _clear(tuning)
            for key, entry in table.items():
                mode, D, R, b, S, *layout = key.split("-")
                R, S = int(R[1:]), tuning.bucket_size(S)
                args = (mode, S, R // 2, R - R // 2, int(D[1:]), int(b[1:]), cpu, *layout)
                default = tuning.default_config(mode, S, R, int(D[1:]), int(b[1:]), 132)
                assert tuning.get_config(*args) == (entry if tuned else default), key
    finally:
        _clear(tuning)  # the later tests' lookups, with this machine's GPU


@pytest.mark.cpu_only  # an environment variable read at import
def test_untuned_switch_is_read_from_the_environment(kernel):
    """ROPE_BWD_TUNED=0 in the environment turns TUNED off for the process; unset, it is on."""
    code = f"""import importlib, kernels
print(importlib.import_module(kernels.get_kernel({REPO_ID!r}, version=1).__name__ + ".tuning").TUNED)"""
    for value, want in (("0", "False"), (None, "True")):
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "ROPE_BWD_TUNED": value}
        if value is None:
            del env["ROPE_BWD_TUNED"]
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == want
