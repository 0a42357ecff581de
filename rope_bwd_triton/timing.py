"""GPU time of one call on a cold L2 (docs/design.md, section 7), by two methods at once.

Per timed call: zero a buffer of 2x the L2 size (evicts everything the previous
call left in L2, lines of evict_last priority included: see the flush kernel),
record a CUDA event, make the call, record another event. The
host enqueues a batch of such calls behind a `torch.cuda._sleep` long enough to
cover the whole batch, so the GPU never waits for the host's Python or launch
overhead. The sleep length is calibrated, and a batch is redone with a longer
sleep if the GPU finished sleeping before the host finished enqueuing it.

All the while torch.profiler (CUPTI) records the GPU's activity, so every timed
call gives two figures:

    events  the CUDA events' elapsed time around the call
    span    the kernel span, as SOL-ExecBench times: from the start of the first
            GPU activity (kernel, memset or memcpy) the call launched to the end
            of the last one

`ColdL2Timer(primary=...)` picks the figure `timer(fn)` returns; the other one
rides along in `Stats.other`. Means are over the calls of one `timer(fn)`.

The span is the events' time less the launch latency after the flush, and the
profiler hardly moves the events; but it costs host time: CUPTI starts in the
first profiled call of a process, and every `timer(fn)` takes longer under it
(docs/design.md, section 7). A caller that times many candidates and needs only the
events can pass `profile=False`.

On a CPU device the same interface times wall clock without a cache flush and
without a profiler (`Stats.other` is None): only there to exercise the code
path, the numbers mean nothing.

`timer.in_rounds` times several calls in rotating rounds (bench: a workload's
implementations, ours and the A/B builds among them); `interleave` takes turns
round by round, for the commands that time things by the host's clock or over
whole steps (overhead, e2e).
"""

import contextlib
import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

BATCH = 10  # calls per sleep: a short queue, far below the driver's pending-launch limit
MAX_RETRIES = 4
METHODS = ("events", "span")
FLUSH_BLOCK = 4096


@dataclass
class Stats:
    mean_us: float
    median_us: float
    min_us: float
    max_us: float
    std_us: float
    n: int
    other: Optional["Stats"] = None  # the same calls by the timer's other method (ColdL2Timer.other)

    @classmethod
    def of(cls, times_us, other=None):
        return cls(
            mean_us=statistics.fmean(times_us),
            median_us=statistics.median(times_us),
            min_us=min(times_us),
            max_us=max(times_us),
            std_us=statistics.pstdev(times_us),
            n=len(times_us),
            other=other,
        )

    def as_dict(self):
        return asdict(self)


class Activity(NamedTuple):
    """One GPU activity from the profiler: name, start and end (us), stream."""

    name: str
    start: float
    end: float
    stream: int


@triton.jit
def rope_bench_cold_l2_flush(ptr, n, BLOCK: tl.constexpr):
    """The L2 flush: zeroes n int32 words twice in one launch (grid 2 * cdiv(n, BLOCK)), the
    first pass with evict_last priority, the second with the default one. CUPTI reports a
    Triton kernel by its function's name, and no peer launches one of this name.

    Why two passes: lines that a kernel loaded with evict_last priority (inductor's kernels
    load broadcast and re-read operands that way) outlive stores of the default priority, of
    any volume: after a one-pass flush a copy whose source had been read with evict_last ran
    faster than on fresh buffers (benchmarks/RESULTS.md, the cold-L2 check). Stores of evict_last
    priority displace those lines; the second pass gives the buffer's lines the default
    priority back, so that the timed call's own loads evict them as usual (the copy then
    takes its fresh-buffer time). Programs start in about the order of their ids, so the
    first pass is over before the second reaches lines the first left in L2. `flush_check`
    measures this in every run."""
    pid = tl.program_id(0)
    per_pass = tl.num_programs(0) // 2
    offs = (pid % per_pass).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if pid < per_pass:
        tl.store(ptr + offs, 0, mask=offs < n, eviction_policy="evict_last")
    else:
        tl.store(ptr + offs, 0, mask=offs < n)


@triton.jit
def rope_bench_copy(src, dst, n, BLOCK: tl.constexpr, EVICTION: tl.constexpr):
    """dst = src (n int32 words), loading src with the given L2 eviction priority (flush_check)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n, eviction_policy=EVICTION), mask=offs < n)


FLUSH_KERNEL = rope_bench_cold_l2_flush.__name__  # unique: the flushes split the device timeline into calls


def split_spans(activities, flushes: int) -> list:
    """Kernel span (us) of what ran between each flush and the next, in the order of the flushes.

    `activities`: the GPU activities (kernels, memsets, memcpys) of one profiling session in
    which exactly `flushes` FLUSH_KERNEL launches went to one stream. Why split at the flush
    rather than bracket each call with record_function and read the profiler's GPU-side
    user-annotation spans: kineto attributes a GPU activity to the innermost annotation open
    at its launch, and torch.compile opens its own (compiled-region and graph-call ranges), so
    a peer's kernels would go missing from ours; those spans also need CPU-op tracing and have
    changed between releases. Stream order needs none of that: everything a call enqueues
    runs after its flush and before the next one's. Activities before the first flush are not
    ours (there are none: the timer synchronizes before it starts the profiler). A segment with
    no activity gives None (nothing ran: the caller decides whether that is an error). Raises
    when nothing was recorded, when the flush count differs (a segment would be misattributed),
    or when a segment holds work of another stream (stream order says nothing about it).
    """
    acts = sorted(activities, key=lambda a: (a.start, a.end))
    if not acts:
        raise RuntimeError("kernel span: the profiler recorded no GPU activity (CUPTI unavailable or disabled?)")
    cuts = [i for i, a in enumerate(acts) if FLUSH_KERNEL in a.name]
    if len(cuts) != flushes:
        raise RuntimeError(
            f"kernel span: the profiler recorded {len(cuts)} '{FLUSH_KERNEL}' kernels, "
            f"{flushes} were launched: the device timeline cannot be split into calls"
        )
    stream = acts[cuts[0]].stream
    spans = []
    for first, nxt in zip(cuts, cuts[1:] + [len(acts)]):
        seg = acts[first + 1 : nxt]
        alien = [a.name for a in seg if a.stream != stream]
        if alien:
            raise RuntimeError(
                f"kernel span: GPU work on another stream than the timed one ({alien[0]!r}): "
                "it cannot be attributed to a call"
            )
        spans.append(max(a.end for a in seg) - seg[0].start if seg else None)
    return spans


def _gpu_activities(prof) -> list:
    """The kernels, memsets and memcpys a finished torch.profiler.profile recorded.

    FunctionEvent's name, device_type, time_range (us), device_resource_id (the stream of
    a GPU activity) and is_user_annotation are all in torch 2.4 and later (checked on 2.11
    and 2.13); its activity_type, which would name the kind, is not in 2.11. The events of
    device type CUDA are kernels, memsets, memcpys, GPU user annotations (dropped here), and
    CUDA sync events and profiler ranges, which need options this timer never sets.
    """
    cuda = torch.autograd.DeviceType.CUDA
    return [
        Activity(e.name, e.time_range.start, e.time_range.end, e.device_resource_id)
        for e in prof.events()
        if e.device_type == cuda and not e.is_user_annotation
    ]


class ColdL2Timer:
    """timer(fn) -> Stats of `calls` timed calls of fn() after `warmup` untimed ones, by the
    `primary` method ('events' or 'span'); Stats.other holds the same calls by the other one
    (None with profile=False: events alone, no profiler)."""

    def __init__(self, device, calls: int = 40, warmup: int = 3, primary: str = "events", profile: bool = True):
        if primary not in METHODS:
            raise ValueError(f"primary must be one of {METHODS}, not {primary!r}")
        if primary == "span" and not profile:
            raise ValueError("the kernel span needs the profiler: primary='span' with profile=False")
        self.device = torch.device(device)
        self.calls, self.warmup, self.primary, self.profile = calls, warmup, primary, profile
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            props = torch.cuda.get_device_properties(self.device)
            self.l2_bytes = props.L2_cache_size
            self.flush = torch.empty(2 * self.l2_bytes // 4, dtype=torch.int32, device=self.device)
            self._flushes = []  # per flush launched in the current profiling session: is a timed call next?
            self._zero()  # compiles the flush kernel
            self.cycles_per_us = self._calibrate_sleep()
        else:
            self.l2_bytes = None

    @property
    def other(self) -> Optional[str]:
        """The method of Stats.other: the one that is not primary (None on the CPU or unprofiled: no second figure)."""
        return (set(METHODS) - {self.primary}).pop() if self.cuda and self.profile else None

    @property
    def method(self) -> str:
        if not self.cuda:
            return "CPU wall clock, no cache flush (code-path check only: the numbers mean nothing)"
        span = "kernel span (CUPTI through torch.profiler: first GPU activity of a call to the end of its last)"
        events = "CUDA events around the call"
        first, second = (span, events) if self.primary == "span" else (events, span)
        return (
            f"{first}, cold L2 ({2 * self.l2_bytes >> 20} MiB zeroed before each call), "
            f"GPU kept busy with torch.cuda._sleep while the host enqueues"
            + (f"; also recorded: {second}" if self.other else "")
        )

    def _zero(self):
        n = self.flush.numel()
        rope_bench_cold_l2_flush[(2 * triton.cdiv(n, FLUSH_BLOCK),)](self.flush, n, BLOCK=FLUSH_BLOCK)

    def _flush(self, timed: bool):
        """Evict L2; `timed`: whether the call enqueued next is one of the timed ones."""
        self._flushes.append(timed)
        self._zero()

    def _calibrate_sleep(self) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 1_000_000
        torch.cuda._sleep(cycles)  # first use loads the sleep kernel
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) * 1e3)

    def __call__(self, fn) -> Stats:
        return self.stats(self.samples(fn, self.calls))

    def stats(self, samples: dict) -> Stats:
        """Stats of `samples` (what samples() returns, or several of them joined)."""
        primary = samples[self.primary if self.other else "events"]
        return Stats.of(primary, other=Stats.of(samples[self.other]) if self.other else None)

    def samples(self, fn, calls: int) -> dict:
        """{method: [us of each of `calls` timed calls of fn()]}, after `warmup` untimed calls;
        "events" alone on the CPU or unprofiled."""
        for _ in range(self.warmup):
            fn()
        if not self.cuda:
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
            return {"events": times}
        torch.cuda.synchronize(self.device)
        self._flushes = []
        # The host cost is measured under the profiler too: CUPTI makes each launch dearer.
        recording = (
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            if self.profile
            else contextlib.nullcontext()
        )
        with recording as prof:
            host_us = self._host_cost_us(fn)
            events = []
            for first in range(0, calls, BATCH):
                events += self._batch(fn, min(BATCH, calls - first), host_us)
        if not self.profile:
            return {"events": events}
        spans = split_spans(_gpu_activities(prof), len(self._flushes))
        spans = [s for s, timed in zip(spans, self._flushes) if timed]
        assert len(spans) == len(events) == calls
        if None in spans:
            raise RuntimeError(f"kernel span: {spans.count(None)} of {len(spans)} timed calls launched no GPU work")
        return {"events": events, "span": spans}

    def in_rounds(self, fns: dict, rounds: int) -> dict:
        """{name: Stats or the exception it raised} of each fn of `fns` ({name: fn}), its `calls`
        timed calls split over `rounds` rounds in which every name takes its turn, each round
        starting one name later: where in the order a call is timed (the drift of the machine,
        what the call before it left behind) then lands on every name alike, as an A/B needs."""
        if not fns:
            return {}
        shares = [self.calls // rounds + (r < self.calls % rounds) for r in range(rounds)]
        shares = [n for n in shares if n]
        failed, done = {}, {name: 0 for name in fns}

        def turn(name):
            if name in failed:
                return None
            try:
                out = self.samples(fns[name], shares[done[name]])
            except Exception as exc:  # one failing implementation must not cost the others' run
                failed[name] = exc
                return None
            done[name] += 1
            return out

        turns = interleave(fns, turn, len(shares), rotate=True)
        return {
            name: failed.get(name) or self.stats({m: [t for part in parts for t in part[m]] for m in parts[0]})
            for name, parts in turns.items()
        }

    def _host_cost_us(self, fn) -> float:
        """Host time to enqueue one flushed, timed call (the GPU idles meanwhile, so it never blocks)."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        for _ in range(2):
            self._flush(timed=False)
            start.record()
            fn()
            end.record()
        cost = (time.perf_counter() - t0) / 2 * 1e6
        torch.cuda.synchronize(self.device)
        return cost

    def _batch(self, fn, n: int, host_us: float) -> list:
        sleep_us = 2 * n * host_us + 200
        for _ in range(MAX_RETRIES):
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            awake = torch.cuda.Event()
            self._flush(timed=False)  # a fence: keeps the sleep out of the span of the call before it
            torch.cuda._sleep(math.ceil(sleep_us * self.cycles_per_us))
            awake.record()
            first = len(self._flushes)
            for start, end in events:
                self._flush(timed=True)
                start.record()
                fn()
                end.record()
            slept_through = not awake.query()  # still asleep: every call was queued before any ran
            torch.cuda.synchronize(self.device)
            if slept_through:
                return [start.elapsed_time(end) * 1e3 for start, end in events]
            self._flushes[first:] = [False] * n  # redone: these calls are not timed
            sleep_us *= 4
        raise RuntimeError(f"the host could not enqueue {n} calls within a {sleep_us / 4:.0f} us GPU sleep")


def interleave(names, turn, rounds: int, *, rotate: bool = False) -> dict:
    """{name: [turn(name) of each round]}: `rounds` rounds in which every name takes its turn, so
    that drift of the machine (clocks, temperature, a noisy host) lands on every name alike rather
    than on whichever ran then. rotate: each round starts one name later (e2e), so that none
    always follows the same one."""
    names = list(names)
    out = {name: [] for name in names}
    for r in range(rounds):
        first = r % len(names) if rotate else 0
        for name in names[first:] + names[:first]:
            out[name].append(turn(name))
    return out


def time_us(nbytes: float, GBps: float) -> float:
    """Microseconds to move nbytes at GBps (GB/s = bytes per ns)."""
    return nbytes / (GBps * 1e3)


def bandwidth_GBps(nbytes: float, us: float) -> float:
    """GB/s achieved moving nbytes in us microseconds."""
    return nbytes / (us * 1e3)


def copy_bandwidth(timer: ColdL2Timer, nbytes: int = 1 << 30) -> dict:
    """Device-to-device copy of nbytes, timed like any call; bandwidth counts read + write."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=timer.device)
    dst = torch.empty_like(src)
    stats = timer(lambda: dst.copy_(src))
    return {"bytes": nbytes, "GBps": bandwidth_GBps(2 * nbytes, stats.mean_us), "time": stats.as_dict()}


def flush_check(timer: ColdL2Timer, nbytes: int = 8 << 20) -> dict:
    """Whether the flush evicts lines of evict_last priority: a copy of nbytes timed on fresh
    buffers, then on fresh buffers whose source was first read with evict_last. A flush that
    leaves those lines in L2 makes the second faster (as one pass of default-priority stores
    did); ratio = second / first."""

    def copy(src, dst, eviction):
        rope_bench_copy[(triton.cdiv(src.numel(), FLUSH_BLOCK),)](
            src, dst, src.numel(), BLOCK=FLUSH_BLOCK, EVICTION=eviction
        )

    times = {}
    for case in ("fresh", "after_evict_last_read"):
        src = torch.randint(0, 1 << 30, (nbytes // 4,), dtype=torch.int32, device=timer.device)
        dst = torch.empty_like(src)
        if case != "fresh":
            copy(src, dst, "evict_last")
        times[case] = timer(lambda: copy(src, dst, "")).mean_us
    return {"bytes": nbytes, "us": times, "ratio": times["after_evict_last_read"] / times["fresh"]}
