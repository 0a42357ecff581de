"""A launch of the compiled kernel that skips Triton's per-call argument binding and
specialization, whose host time exceeds the kernel's own at small S.

The one module that touches torch's and Triton's private launch internals (torch._C's
_StaticCudaLauncher, a compiled kernel's run/metadata, triton.knobs' launch hooks; kernels' and
transformers' private parts are in internals.py). `launcher` returns None where they are missing,
and launch.py then launches through `kernel[grid]`; ROPE_BWD_FAST_LAUNCH=0 does so always.
"""

import functools
import os
import threading
import warnings

import triton

ENABLED = os.environ.get("ROPE_BWD_FAST_LAUNCH", "1") != "0"


def launcher(compiled, const_args, device):
    """A function (grid, args) that launches `compiled` (JITFunction.warmup's) on the current
    stream of `device`; args: addresses as ints, seq_len. None where this Triton lacks what it
    needs. Without launch hooks through torch's launcher of compiled Triton kernels (inductor's);
    with hooks (profilers), or where torch has none, through Triton's."""
    try:
        runtime = triton.knobs.runtime
        runtime.launch_enter_hook, runtime.launch_exit_hook  # noqa: B018 (must exist)
        compiled.packed_metadata, compiled.launch_metadata  # noqa: B018
        current_stream = triton.runtime.driver.active.get_current_stream
    except AttributeError as e:
        warn(e)
        return None
    static = _torch_launcher(compiled, device)

    def launch(grid, args):
        stream = current_stream(device)
        enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
        hooked = _hooked(enter) or _hooked(leave)
        if static is not None and not hooked:
            static(grid, stream, args)
            return
        run = compiled.run  # Triton's launcher: built, and the module loaded, at its first use
        full = (*args, *const_args)
        if hooked:
            meta = compiled.launch_metadata(grid, stream, *full)
        else:  # empty hook chains cost host time for nothing
            meta = enter = leave = None
        run(grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata, meta, enter, leave, *full)

    return launch


def _torch_launcher(compiled, device):
    """(grid, stream, args) -> None through torch._C._StaticCudaLauncher; None where this torch or
    kernel does not take it (no such launcher, scratch memory, cooperative launch)."""
    try:
        from torch._C import _StaticCudaLauncher

        launch_kernel = _StaticCudaLauncher._launch_kernel
        md = compiled.metadata
        if md.num_ctas != 1 or getattr(md, "launch_cooperative_grid", False) or getattr(md, "launch_pdl", False):
            return None
        types = {"i32": "i", "i64": "l"}
        arg_tys = "".join("O" if t[0] == "*" else types[t] for t in compiled.src.signature.values() if t != "constexpr")
        # Recent Tritons' kernels take global and profile scratch pointers last: null when unused.
        scratch = [getattr(md, n, None) for n in ("global_scratch_size", "profile_scratch_size")]
        if any(scratch):
            return None
        num_warps, shared = md.num_warps, md.shared
        cubin = next(path for name, path in compiled.metadata_group.items() if name.endswith(".cubin"))
        function = _load(cubin, compiled.name, shared, device)
    except (ImportError, AttributeError, KeyError, StopIteration, RuntimeError):
        return None
    nulls = tuple(None for size in scratch if size is not None)
    arg_tys += "O" * len(nulls)

    def launch(grid, stream, args):
        launch_kernel(function, grid[0], grid[1], 1, num_warps, shared, arg_tys, (*args, *nulls), stream)

    return launch


@functools.cache
def _load(cubin, name, shared, device):
    """The cubin's function on `device`, loaded once per process."""
    from torch._C import _StaticCudaLauncher

    # (function, registers, spills) up to torch 2.12, (module, function, registers, spills) from 2.13
    return _StaticCudaLauncher._load_kernel(cubin, name, shared, device)[-3]


@functools.cache
def _warned():
    return []


def warn(error):
    """Says once per process that launches go through kernel[grid] (more host time per call)."""
    if not _warned():
        _warned().append(error)
        warnings.warn(
            f"rope_bwd: this Triton ({triton.__version__}) does not take the fast launch "
            f"({type(error).__name__}: {error}); launching through rotary_kernel[grid]",
            RuntimeWarning,
            stacklevel=4,
        )


def _hooked(hook):
    """Whether a launch hook would do something: set, and not an empty HookChain."""
    return hook is not None and getattr(hook, "calls", True) != []


@functools.cache
def start_up():
    """Once per process, before the first compilation: Triton's hash of its own libraries (its
    cache key) starts in a thread, overlapping the build of its driver's C utilities."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        return
    if getattr(triton.runtime.driver, "_active", None) is None:
        threading.Thread(target=triton_key, name="rope_bwd: triton_key", daemon=True).start()
