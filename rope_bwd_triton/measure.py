"""The measurement of `bench --preset suite` (and of copybound, which adds to it): ours against
the byte floor and the peers (docs/design.md, section 7).

In one process: the device-to-device copy bandwidth; then for every workload the byte floor
of each task and the cold-L2 GPU time per call (mean of --calls calls) of our variants, of
the peers and of a device copy of the same bytes (a reference), each verified (against the
float64 reference; the copy against its source) before it is timed.

Tasks (byte floors from suite.floor_bytes; bf16 tasks count 2 bytes per q/k and gradient
element, the tables stay fp32 and count 4):
    bwd       full backward, fp32: SOL-ExecBench 019
    bwd_qk    q/k-only backward, fp32: cos/sin need no gradient (the real models)
    bwd_bf16  full backward, bf16 gradients/q/k, fp32 embeddings
    fwd, fwd_bf16   the fused forward
"""

import sys
from dataclasses import dataclass

from . import suite
from .suite import TASKS

SCALING = [(S, 16, 128) for S in (16384, 65536)] + [(S, 16, D) for D in (72, 80) for S in (4096, 16384)]
PEERS = ("eager", "compile", "liger", "copy")


@dataclass
class Impl:
    name: str
    label: str
    task: str
    peer: str | None  # which --peers entry enables it; None for ours
    make: object  # (kernel, inputs of the task) -> Call
    check: object = None  # (Call) -> verification dict, for what the float64 reference does not judge


class Data:
    """One workload's inputs on the device, in fp32 and bf16 (tables stay fp32)."""

    def __init__(self, S, H, D, device, seed):
        import torch

        gen = torch.Generator().manual_seed(seed)
        x = suite.make_inputs(S, H, D, generator=gen, device=device)
        self.S, self.H, self.D = S, H, D
        big = [x[n] for n in ("grad_q_embed", "grad_k_embed", "q", "k")]
        self.big = {"float32": big, "bfloat16": [t.to(torch.bfloat16) for t in big]}
        self.embeddings = x["embeddings"]
        # The q/k-only mode uses the real models' table cat(freqs, freqs), which Liger assumes.
        e = self.embeddings[:, : D // 2]
        self.emb_dup = torch.cat((e, e), dim=1)
        self.cos, self.sin = self.emb_dup.cos(), self.emb_dup.sin()

    def inputs(self, mode, dtype):
        """fwd: q, k, embeddings; bwd: gq, gk, q, k, embeddings; bwd_qk: gq, gk, cos, sin."""
        gq, gk, q, k = self.big[dtype]
        if mode == "fwd":
            return [q, k, self.embeddings]
        if mode == "bwd":
            return [gq, gk, q, k, self.embeddings]
        return [gq, gk, self.cos, self.sin]

    def reference(self, mode, dtype, rows):
        """float64 reference outputs on the given token rows (tokens are independent)."""
        gq, gk, q, k = (t[rows.to(t.device)] for t in self.big[dtype])
        pick = rows.to(self.embeddings.device)
        if mode == "fwd":
            return suite.reference_forward(*(t.cpu().double() for t in (q, k, self.embeddings[pick])))
        if mode == "bwd":
            return suite.reference_backward(gq, gk, q, k, self.embeddings[pick])
        return suite.reference_backward(gq, gk, q, k, self.emb_dup[pick])[:2]


class Call:
    """fn(*args) as a zero-argument call that keeps its latest outputs (for verification)."""

    def __init__(self, fn, *args):
        self.fn, self.args, self.last = fn, args, ()

    def __call__(self):
        self.last = tuple(self.fn(*self.args))


# make(kernel, x) -> Call, x = Data.inputs(mode, dtype) of the implementation's task.


def _ours_bwd(kernel, x):
    import torch

    # NaN before the verified first call: an element the kernel fails to write cannot pass
    out = tuple(torch.full_like(x[i], float("nan")) for i in (0, 1, 4))
    return Call(lambda *a: kernel.rope_bwd(*a, out=out), *x)  # destination passing: nothing allocated


def _ours_bwd_qk(kernel, x):
    # The op the autograd backward calls when cos/sin need no gradient; it allocates dq, dk. Builds
    # from before interleaved pairs (A/B) take no `interleaved` (later `pairs`) argument.
    schema = kernel._ops.ops.rotary_bwd.default._schema
    extra = (False,) if any(a.name in ("interleaved", "pairs") for a in schema.arguments) else ()
    return Call(
        lambda gq, gk, cos, sin: kernel.ops.rotary_bwd(gq, gk, None, None, cos, sin, True, True, *extra)[:2], *x
    )


def _ours_fwd(kernel, x):
    return Call(kernel.rope_fwd, *x)


_COMPILED = {}


def _peer(fn_name, compile_):
    def make(kernel, x):
        from . import peers

        fn = getattr(peers, fn_name)
        if compile_:  # one torch.compile object per function for the whole run: it recompiles per shape
            if fn not in _COMPILED:
                _COMPILED[fn] = peers.compiled(fn)
            fn = _COMPILED[fn]
        return Call(fn, *x)

    return make


def _liger(kernel, x):
    from . import peers

    # In place on private copies: the first call (verified) sees fresh gradients; the timed
    # calls keep rotating the same buffers, which moves the same bytes and keeps values bounded.
    return Call(peers.liger_rope_backward(), x[0].clone(), x[1].clone(), x[2], x[3])


def _copy(task):
    """A device-to-device copy of the task's floor bytes (half read, half written): the time
    of a call that only moves those bytes, its launch and DRAM ramp included, which the
    floor (bytes / bandwidth of a 1 GiB copy) leaves out."""

    def make(kernel, x):
        import torch

        S, H, D = x[0].shape
        nbytes = suite.floor_bytes(S, H, D, elem=x[0].element_size(), table_elem=4, mode=TASKS[task][1])
        src = torch.randint(0, 256, (nbytes // 2,), dtype=torch.uint8, device=x[0].device)
        dst = torch.empty_like(src)
        return Call(lambda: (dst.copy_(src), src))

    return make


def _check_copy(call):
    import torch

    dst, src = call.last
    same = torch.equal(dst, src)
    return {
        "max_rel_err": 0.0 if same else float("inf"),
        "sol_pass_fraction": 1.0 if same else 0.0,
        "ok": same,
        "what": "destination equals source",
    }


IMPLS = [
    Impl("ours_bwd", "ours: rope_bwd(out=)", "bwd", None, _ours_bwd),
    Impl("eager_bwd", "eager PyTorch reference", "bwd", "eager", _peer("eager_backward", False)),
    Impl("compiled_bwd", "torch.compile(reference)", "bwd", "compile", _peer("eager_backward", True)),
    Impl("ours_bwd_qk", "ours: ops.rotary_bwd (q/k only)", "bwd_qk", None, _ours_bwd_qk),
    Impl("compiled_bwd_qk", "torch.compile(q/k-only reference)", "bwd_qk", "compile", _peer("eager_backward_qk", True)),
    Impl("liger_bwd_qk", "Liger-Kernel rope_backward (in place)", "bwd_qk", "liger", _liger),
    Impl("ours_bwd_bf16", "ours: rope_bwd(out=), bf16", "bwd_bf16", None, _ours_bwd),
    Impl("ours_fwd", "ours: rope_fwd", "fwd", None, _ours_fwd),
    Impl("ours_fwd_bf16", "ours: rope_fwd, bf16", "fwd_bf16", None, _ours_fwd),
] + [Impl(f"copy_{task}", "device copy of the same bytes", task, "copy", _copy(task), _check_copy) for task in TASKS]


def ab_name(i: int) -> str:
    """The name of the i-th other build of ours (--ab): ab, ab2, ab3, ..."""
    return "ab" if i == 0 else f"ab{i + 1}"


def _skip_reason(impl, device):
    if impl.peer != "liger":
        return None
    if device.type != "cuda":
        return "Liger-Kernel's Triton kernel needs a CUDA GPU"
    from . import peers

    return None if peers.liger_rope_backward() else "liger-kernel is not installed"


def measure_workload(kernel, impls, timer, bandwidth, set_name, S, H, D, args, bar):
    """One workload, task by task: each implementation in `impls` verified against float64, then
    the task's implementations (ours, the A/B builds, the peers) timed by `timer` in --rounds
    rotating rounds; `bar` (tqdm) shows progress. Returns the workload's entry of the run JSON."""
    import torch

    from .timing import bandwidth_GBps, time_us

    seed = args.seed * 1_000_003 + S * 1009 + H * 31 + D
    data = Data(S, H, D, timer.device, seed)
    rows = suite.verify_rows(S, args.verify_tokens, seed)
    results, by_name = {}, {i.name: i for i in impls}

    def failed(impl, error):
        results[impl.name] = {"label": impl.label, "task": impl.task, "error": f"{type(error).__name__}: {error}"}
        bar.write(f"  {impl.name} S={S} H={H} D={D}: {results[impl.name]['error']}")

    floors = {}
    for task, (_, mode, dtype) in TASKS.items():
        nbytes = suite.floor_bytes(S, H, D, elem=getattr(torch, dtype).itemsize, table_elem=4, mode=mode)
        floor = floors[task] = {"bytes": nbytes, "us": time_us(nbytes, bandwidth)}
        calls, checks, ref = {}, {}, None
        for impl in (i for i in impls if i.task == task):
            bar.set_postfix_str(f"S={S} H={H} D={D} {impl.name}")
            reason = _skip_reason(impl, timer.device)
            if reason:
                results[impl.name] = {"label": impl.label, "task": task, "skipped": reason}
                bar.update()
                continue
            try:
                call = impl.make(kernel, data.inputs(mode, dtype))
                call()
                if impl.check:
                    checks[impl.name] = impl.check(call)
                else:
                    ref = ref if ref is not None else data.reference(mode, dtype, rows)
                    checks[impl.name] = suite.judge(call.last, ref, dtype, rows)
                calls[impl.name] = call
            except Exception as exc:  # one failing peer must not cost the whole (GPU-time limited) run
                failed(impl, exc)
                bar.update()
        bar.set_postfix_str(f"S={S} H={H} D={D} timing {task}")
        for name, stats in timer.in_rounds(calls, args.rounds).items():
            impl = by_name[name]
            bar.update()
            if isinstance(stats, Exception):
                failed(impl, stats)
                continue
            check = checks[name]
            results[name] = {
                "label": impl.label,
                "task": task,
                "time": stats.as_dict(),
                "x_floor": stats.mean_us / floor["us"],
                "GBps": bandwidth_GBps(floor["bytes"], stats.mean_us),
                "verify": check,
            }
            if not check["ok"]:
                bar.write(f"  {name} S={S} H={H} D={D}: verification FAILED (rel err {check['max_rel_err']:.2e})")
        del calls
    del data
    if timer.cuda:
        torch.cuda.empty_cache()
    results = {name: results[name] for name in by_name if name in results}
    return {"set": set_name, "S": S, "H": H, "D": D, "floors": floors, "results": results}


def workloads(args):
    """[(set, S, H, D)]: the custom sizes of --seq-lens x --head-dims, else those of --set."""
    if args.seq_lens:
        return [("custom", S, args.heads, D) for D in args.head_dims for S in args.seq_lens]
    out = []
    if args.set in ("suite", "all"):
        out += [("suite", S, suite.HEADS, suite.HEAD_DIM) for S in suite.SEQ_LENS]
    if args.set in ("scaling", "all"):
        out += [("scaling", *w) for w in SCALING]
    return out


def measure(args, kernel, others=(), after_workload=None) -> dict:
    """The run `args` (bench's resolved arguments) ask for, of the loaded package `kernel` and
    of other builds of it (`others`, --ab). after_workload(timer, entry, bar): a preset's own
    work on each measured workload (copybound)."""
    from tqdm import tqdm

    from .output import run_meta
    from .report import summarize
    from .timing import ColdL2Timer, copy_bandwidth, flush_check

    timer = ColdL2Timer(args.device, calls=args.calls, primary=args.timer)
    copy = copy_bandwidth(timer, args.copy_mib << 20)
    impls = [i for i in IMPLS if i.task in args.tasks and (i.peer is None or i.peer in args.peers)]
    impls += [
        Impl(
            f"{ab_name(n)}_{i.name}",
            f"A/B {other.__name__}: {i.label}",
            i.task,
            None,
            lambda _, x, make=i.make, other=other: make(other, x),
        )
        for n, other in enumerate(others)
        for i in impls
        if i.peer is None
    ]
    todo = workloads(args)
    meta = run_meta(timer.device, kernel=kernel, timer=timer, rounds=args.rounds)
    measured = []
    with tqdm(total=len(todo) * len(impls), desc="bench", unit="run", file=sys.stderr) as bar:
        for set_name, S, H, D in todo:
            measured.append(measure_workload(kernel, impls, timer, copy["GBps"], set_name, S, H, D, args, bar))
            if after_workload:
                after_workload(timer, measured[-1], bar)
    run = {
        "meta": meta,
        "copy": copy,
        "impls": {i.name: {"label": i.label, "task": i.task} for i in impls},
        "workloads": measured,
    }
    if timer.cuda:
        run["flush_check"] = flush_check(timer)
    run["summary"] = summarize(run)
    return run


def workload_name(w) -> str:
    return f"S={w['S']} H={w['H']} D={w['D']}"
