"""The launch path of eager calls (launch.py, fast_launch.py): once Triton has compiled a
layout's kernel, every launch skips Triton's argument binding and calls the compiled kernel
with addresses, through torch's launcher of compiled Triton kernels where torch has one;
where the private torch/Triton internals it needs are missing, or ROPE_BWD_FAST_LAUNCH=0,
launches go through rotary_kernel[grid]. Both paths must compute the same results.

The GPU tests run both paths; the CPU tests hold the pieces to stand-ins of what Triton and
torch hand over."""

import json
import os
import subprocess
import sys
import types
import warnings

import pytest
import torch

from . import reference
from .helpers import REPO_ID, submodule
from .test_ops import launch_and_check


@pytest.fixture
def paths(kernel, monkeypatch):
    """(launch, fast_launch) modules with fresh plans and the fast launch's warning not yet
    given; every launch through Triton's binder recorded in `runs` (warmup=True: a compilation
    without a launch; False: a launch through rotary_kernel[grid])."""
    launch, fast = submodule(kernel, "launch"), submodule(kernel, "fast_launch")
    monkeypatch.setattr(fast, "ENABLED", True)  # whatever the environment says
    launch._plan.cache_clear()  # no plan left from other tests
    fast._warned.cache_clear()
    runs, run = [], launch.rotary_kernel.run
    monkeypatch.setattr(launch.rotary_kernel, "run", lambda *a, **kw: runs.append(kw["warmup"]) or run(*a, **kw))
    yield types.SimpleNamespace(launch=launch, fast=fast, runs=runs)
    launch._plan.cache_clear()
    fast._warned.cache_clear()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode,shape", [("bwd", "D72"), ("bwd_qk", "D80-R48"), ("fwd", "D72-interleaved"),
                                        ("bwd_q", "D128-R104")])  # fmt: skip
def test_fast_launch_gpu(paths, dtype, mode, shape, gen, monkeypatch):
    """Triton compiles a layout's kernel without launching it; then every launch of the layout,
    the first too, calls the compiled kernel with addresses (null for the pointers a mode does
    not use), through torch's launcher where torch has one. Launches must see new data, compile
    anew for pointers of another alignment (Triton specializes on it), and call launch hooks
    (profilers) as Triton does, through Triton's launcher."""
    static_runs, static = [], paths.fast._torch_launcher

    def spy(compiled, device):
        launch = static(compiled, device)
        return launch and (lambda *a: static_runs.append(1) or launch(*a))

    monkeypatch.setattr(paths.fast, "_torch_launcher", spy)
    cfg = dict(BLOCK_S=1, BLOCK_D=32, BLOCK_R=4, num_warps=1)  # two chunks of heads per program

    def check(offset):  # views `offset` elements into their buffers: same shapes and strides each time
        launch_and_check(paths.launch, mode, cfg, shape, dtype, "cuda", gen, offset, S=33, HQ=4, HK=4)

    check(0)
    assert paths.runs == [True], "the first launch of a layout went through Triton's binder"
    check(0)
    assert paths.runs == [True]
    check(1)  # 2- or 4-byte aligned pointers: another specialization, compiled by Triton
    assert paths.runs == [True, True]
    check(1)
    assert paths.runs == [True, True]
    hooked = []
    monkeypatch.setattr(
        paths.fast.triton.knobs.runtime, "launch_enter_hook", lambda meta: hooked.append(meta.get()["name"])
    )
    check(0)
    assert paths.runs == [True, True] and hooked == ["rotary_kernel"]
    # the four launches without hooks; CUDA builds of torch have the launcher
    assert len(static_runs) == (4 if hasattr(torch._C, "_StaticCudaLauncher") else 0)


@pytest.mark.gpu
@pytest.mark.parametrize("mode,shape", [("bwd_cs", "D72"), ("fwd_cs", "D80-R48-interleaved")])
def test_fast_launch_off_runs_the_same_kernel_gpu(paths, mode, shape, monkeypatch):
    """fast_launch.ENABLED off (ROPE_BWD_FAST_LAUNCH=0): every launch through rotary_kernel[grid],
    none compiled ahead; the results bitwise those of the fast launch on the same inputs."""
    cfg = dict(BLOCK_S=2, BLOCK_D=16, BLOCK_R=8, num_warps=2)
    results = {}
    for enabled in (True, False):
        monkeypatch.setattr(paths.fast, "ENABLED", enabled)
        paths.launch._plan.cache_clear()
        del paths.runs[:]
        for _ in range(3):  # same seed each round: same inputs for both paths
            results.setdefault(enabled, []).append(
                launch_and_check(
                    paths.launch, mode, cfg, shape, torch.bfloat16, "cuda", torch.Generator().manual_seed(7)
                )
            )
        assert paths.runs == ([True] if enabled else [False, False, False]), enabled
    for fast, slow in zip(results[True], results[False]):
        for name in fast:
            assert torch.equal(fast[name], slow[name]), name


@pytest.mark.gpu
def test_fast_launch_env_switch_gpu(kernel):
    """ROPE_BWD_FAST_LAUNCH=0 in a fresh process: fast_launch.ENABLED is off and every launch goes
    through rotary_kernel[grid], with right results."""
    code = f"""
import importlib, json, torch, kernels
k = kernels.get_kernel({REPO_ID!r}, version=1)
launch, fast = (importlib.import_module(f"{{k.__name__}}.{{m}}") for m in ("launch", "fast_launch"))
runs, run = [], launch.rotary_kernel.run
launch.rotary_kernel.run = lambda *a, **kw: runs.append(kw["warmup"]) or run(*a, **kw)
g = torch.Generator().manual_seed(0)
q, k_, gq, gk = (torch.randn(17, 3, 72, generator=g).cuda().requires_grad_(i < 2) for i in range(4))
cos, sin = (torch.randn(17, 72, generator=g).cuda() for _ in range(2))
errs = []
for _ in range(2):
    outs = k.apply_rotary_pos_emb_vision(q, k_, cos, sin)
    grads = torch.autograd.grad(outs, (q, k_), (gq, gk))
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k_)]
    rc, rs = (t.cpu().double() for t in (cos, sin))
    half = lambda x: torch.cat((-x[..., 36:], x[..., :36]), -1)
    refs = [x * rc[:, None] + half(x) * rs[:, None] for x in leaves]
    ref_grads = torch.autograd.grad(refs, leaves, (gq.cpu().double(), gk.cpu().double()))
    errs += [((a.cpu().double() - b).norm() / b.norm()).item() for a, b in zip((*outs, *grads), (*refs, *ref_grads))]
print(json.dumps({{"enabled": fast.ENABLED, "runs": runs, "max_err": max(errs)}}))
"""
    env = {**os.environ, "ROPE_BWD_FAST_LAUNCH": "0", "HF_HUB_OFFLINE": "1"}
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["enabled"] is False
    assert got["runs"] == [False] * 4, "a launch did not go through rotary_kernel[grid]"
    assert got["max_err"] <= 2e-6


def test_fast_launch_env_switch(kernel):
    """ROPE_BWD_FAST_LAUNCH=0 turns the fast launch off for the process; unset or 1, it is on
    (read when the module is imported: one process, the module reloaded per value)."""
    code = f"""
import importlib, os, kernels
k = kernels.get_kernel({REPO_ID!r}, version=1)
fast = importlib.import_module(k.__name__ + ".fast_launch")
seen = [fast.ENABLED]
for value in ("1", None):
    if value is None:
        del os.environ["ROPE_BWD_FAST_LAUNCH"]
    else:
        os.environ["ROPE_BWD_FAST_LAUNCH"] = value
    seen.append(importlib.reload(fast).ENABLED)
print(seen)
"""
    env = {**os.environ, "ROPE_BWD_FAST_LAUNCH": "0", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[False, True, True]"


def test_fast_launch_needs_triton_internals(paths, monkeypatch):
    """A Triton without the internals the fast launch uses (here: no triton.knobs) gets no fast
    launcher, and one warning in the process, however many layouts ask."""
    monkeypatch.delattr(paths.fast.triton, "knobs")
    stand_in = type("Compiled", (), {"run": None, "function": None, "packed_metadata": None, "launch_metadata": None})()
    with pytest.warns(RuntimeWarning, match="does not take the fast launch"):
        assert paths.fast.launcher(stand_in, (), 0) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert paths.fast.launcher(stand_in, (), 0) is None  # warned once


def _compiled_stand_in(**metadata):
    """What _torch_launcher reads of a compiled kernel: its name, metadata, files and signature."""
    md = {"num_ctas": 1, "num_warps": 2, "shared": 64, "global_scratch_size": 0, "profile_scratch_size": 0, **metadata}
    signature = {"X": "*bf16", "Y": "*fp32", "S": "i32", "H": "constexpr", "N": "i64"}
    files = {"k.json": "/cache/k.json", "k.cubin": "/cache/k.cubin", "k.ptx": "/cache/k.ptx"}
    return types.SimpleNamespace(
        name="k",
        metadata=types.SimpleNamespace(**md),
        metadata_group=files,
        src=types.SimpleNamespace(signature=signature),
    )


@pytest.mark.parametrize("loaded", [(1234, 20, 0), (5678, 1234, 20, 0)], ids=["torch<2.13", "torch>=2.13"])
def test_torch_launcher_takes_runtime_arguments_only(kernel, monkeypatch, request, loaded):
    """torch's launcher loads the kernel's cubin from Triton's cache onto the given device, once
    per process (its result: the function, or from torch 2.13 the module then the function, with
    the register and spill counts), then gets the loaded function, the grid, warps and shared memory, one type
    code per runtime argument (no constexprs) and a null per scratch pointer Triton appends. A
    kernel that needs what it does not do (scratch memory, cooperative launch, several CTAs),
    one without a cubin or one it cannot load, or a torch without it, gets none."""
    fast = submodule(kernel, "fast_launch")
    loads, calls = [], []

    def load(path, name, shared, device):
        if path != "/cache/k.cubin":
            raise RuntimeError("CUDA driver error: file not found")
        loads.append((path, name, shared, device))
        return loaded

    fake = types.SimpleNamespace(_load_kernel=load, _launch_kernel=lambda *a: calls.append(a))
    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", fake, raising=False)
    fast._load.cache_clear()
    request.addfinalizer(fast._load.cache_clear)
    launch = fast._torch_launcher(_compiled_stand_in(), 3)
    assert loads == [("/cache/k.cubin", "k", 64, 3)]
    fast._torch_launcher(_compiled_stand_in(), 3)
    assert len(loads) == 1, "a kernel loaded onto a device was loaded again"
    launch((7, 2), 99, (11, 12, 40, 13))
    assert calls == [(1234, 7, 2, 1, 2, 64, "OOilOO", (11, 12, 40, 13, None, None), 99)]
    older = _compiled_stand_in()  # a Triton without scratch pointers
    del older.metadata.global_scratch_size, older.metadata.profile_scratch_size
    fast._torch_launcher(older, 0)((1, 1), 0, (1, 2, 3, 4))
    assert calls[-1][6:8] == ("OOil", (1, 2, 3, 4))
    for unsupported in (
        dict(global_scratch_size=256),
        dict(launch_cooperative_grid=True),
        dict(launch_pdl=True),
        dict(num_ctas=2),
    ):
        assert fast._torch_launcher(_compiled_stand_in(**unsupported), 0) is None, unsupported
    for files in ({"k.json": "/cache/k.json"}, {"k.cubin": "/elsewhere/k.cubin"}):
        stand_in = types.SimpleNamespace(**{**vars(_compiled_stand_in()), "metadata_group": files})
        assert fast._torch_launcher(stand_in, 0) is None
    monkeypatch.delattr(torch._C, "_StaticCudaLauncher")
    assert fast._torch_launcher(_compiled_stand_in(), 0) is None


@pytest.mark.kernels_ci  # so also on the newest torch, a CUDA build, in hub CI's environment (scripts/hub-ci.sh)
def test_torch_launcher_is_there_in_cuda_builds_alone():
    """CUDA builds of torch have the launcher the fast launch takes, with the two calls it makes;
    CPU builds have none (launches go through Triton's: test_torch_launcher_takes_runtime_arguments_only)."""
    launcher = getattr(torch._C, "_StaticCudaLauncher", None)
    assert (launcher is not None) == (torch.version.cuda is not None)
    if launcher is not None:
        assert callable(launcher._load_kernel) and callable(launcher._launch_kernel)


@pytest.mark.parametrize("driver_up", [False, True])
def test_start_up_hashes_triton_in_a_thread_once(kernel, monkeypatch, driver_up):
    """Before the first compilation in a process, with Triton's driver not yet up, Triton's
    cache key (a hash of its libraries) is computed in a thread of its own, once, while Triton
    builds its driver utilities; with the driver up, nothing starts."""
    import threading

    import triton.runtime.cache

    fast = submodule(kernel, "fast_launch")
    threads, done = [], threading.Event()

    def triton_key():
        threads.append(threading.current_thread())
        done.set()

    monkeypatch.setattr(triton.runtime.cache, "triton_key", triton_key)
    monkeypatch.setattr(triton.runtime.driver, "_active", object() if driver_up else None)
    fast.start_up.cache_clear()
    try:
        fast.start_up()
        fast.start_up()
        if not driver_up:
            assert done.wait(10)
            threads[0].join(10)
    finally:
        fast.start_up.cache_clear()
    if driver_up:
        assert threads == []
    else:
        assert len(threads) == 1 and threads[0] is not threading.main_thread() and threads[0].daemon


@pytest.mark.gpu
@pytest.mark.parametrize("broken", ["no knobs", "launcher signature"])
def test_fast_launch_falls_back_gpu(paths, gen, monkeypatch, broken):
    """When the fast launch's assumptions fail (an internal missing, or a launcher that takes
    other arguments, which raises before it launches), the layout's launches go through
    Triton's kernel[grid], with one warning, and every result is right."""
    if broken == "no knobs":
        monkeypatch.delattr(paths.fast.triton, "knobs")
    else:

        def changed(compiled, const_args, device):
            def launch(grid, args):
                raise TypeError("function takes 12 positional arguments")

            return launch

        monkeypatch.setattr(paths.fast, "launcher", changed)
    cfg = dict(BLOCK_S=1, BLOCK_D=32, BLOCK_R=8, num_warps=1)
    with pytest.warns(RuntimeWarning, match="does not take the fast launch") as caught:
        for _ in range(4):
            launch_and_check(paths.launch, "bwd_qk", cfg, "D72", torch.bfloat16, "cuda", gen, S=40, HQ=4, HK=4)
    assert len([w for w in caught if "fast launch" in str(w.message)]) == 1
    # one compilation ahead of the first launch, then every launch through rotary_kernel[grid]
    assert paths.runs == [True, False, False, False, False]


@pytest.mark.gpu
def test_fast_launch_failing_after_it_worked_raises_gpu(paths, gen, monkeypatch):
    """A fast launcher that has launched once is trusted: a later TypeError is a real error,
    raised, not taken for a launcher of another signature (that would hide it behind a slower
    path)."""
    real = paths.fast.launcher
    calls = []

    def flaky(compiled, const_args, device):
        launch = real(compiled, const_args, device)

        def run(grid, args):
            calls.append(1)
            if len(calls) > 1:
                raise TypeError("an argument of the wrong type")
            return launch(grid, args)

        return run

    monkeypatch.setattr(paths.fast, "launcher", flaky)
    cfg = dict(BLOCK_S=1, BLOCK_D=32, BLOCK_R=8, num_warps=1)
    launch_and_check(paths.launch, "fwd", cfg, "D72", torch.float32, "cuda", gen, S=9, HQ=2, HK=2)
    with pytest.raises(TypeError, match="an argument of the wrong type"):
        launch_and_check(paths.launch, "fwd", cfg, "D72", torch.float32, "cuda", gen, S=9, HQ=2, HK=2)


@pytest.mark.gpu
def test_public_calls_match_the_reference_on_both_paths_gpu(kernel, paths, gen, monkeypatch):
    """The public functions through either path: bitwise equal results, both right."""
    S, H, D = 65, 4, 80
    q, k, gq, gk = (torch.randn(S, H, D, generator=gen).cuda() for _ in range(4))
    cos, sin = (torch.randn(S, 48, generator=gen).cuda() for _ in range(2))
    results = []
    for enabled in (True, False):
        monkeypatch.setattr(paths.fast, "ENABLED", enabled)
        paths.launch._plan.cache_clear()
        leaves = [t.clone().requires_grad_() for t in (q, k, cos, sin)]
        outs = kernel.apply_rotary_pos_emb_vision(*leaves, interleaved=True)
        results.append([*outs, *torch.autograd.grad(outs, leaves, (gq, gk))])
    for a, b in zip(*results):
        assert torch.equal(a, b)
    refs, ref_grads = reference.reference_rotary_grads(gq, gk, q, k, cos, sin, interleaved=True)
    for got, ref in zip(results[0], [*refs, *ref_grads]):
        assert reference.rel_err(got, ref) <= 2e-6
