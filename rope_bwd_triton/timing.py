"""GPU time of one call on a cold L2 (DESIGN.md section 6).

Per timed call: zero a buffer of 2x the L2 size (evicts everything the previous
call left in L2), record a CUDA event, make the call, record another event. The
host enqueues a batch of such calls behind a `torch.cuda._sleep` long enough to
cover the whole batch, so the events measure the GPU's work only, never the
host's Python or launch overhead. The sleep length is calibrated, and a batch
is redone with a longer sleep if the GPU finished sleeping before the host
finished enqueuing it.

On a CPU device the same interface times wall clock without a cache flush:
only there to exercise the code path, the numbers mean nothing.
"""

import math
import statistics
import time
from dataclasses import asdict, dataclass

import torch

BATCH = 10  # calls per sleep: a short queue, far below the driver's pending-launch limit
MAX_RETRIES = 4


@dataclass
class Stats:
    mean_us: float
    median_us: float
    min_us: float
    max_us: float
    std_us: float
    n: int

    @classmethod
    def of(cls, times_us):
        return cls(
            mean_us=statistics.fmean(times_us), median_us=statistics.median(times_us),
            min_us=min(times_us), max_us=max(times_us),
            std_us=statistics.pstdev(times_us), n=len(times_us),
        )

    def as_dict(self):
        return asdict(self)


class ColdL2Timer:
    """timer(fn) -> Stats of `calls` timed calls of fn() after `warmup` untimed ones."""

    def __init__(self, device, calls: int = 40, warmup: int = 3):
        self.device = torch.device(device)
        self.calls, self.warmup = calls, warmup
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            props = torch.cuda.get_device_properties(self.device)
            self.l2_bytes = props.L2_cache_size
            self.flush = torch.empty(2 * self.l2_bytes, dtype=torch.uint8, device=self.device)
            self.cycles_per_us = self._calibrate_sleep()
        else:
            self.l2_bytes = None

    @property
    def method(self) -> str:
        if self.cuda:
            return (f"CUDA events, cold L2 ({2 * self.l2_bytes >> 20} MiB zeroed before each call), "
                    f"GPU kept busy with torch.cuda._sleep while the host enqueues")
        return "CPU wall clock, no cache flush (code-path check only: the numbers mean nothing)"

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
        for _ in range(self.warmup):
            fn()
        if not self.cuda:
            times = []
            for _ in range(self.calls):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
            return Stats.of(times)
        torch.cuda.synchronize(self.device)
        host_us = self._host_cost_us(fn)
        times = []
        for first in range(0, self.calls, BATCH):
            times += self._batch(fn, min(BATCH, self.calls - first), host_us)
        return Stats.of(times)

    def _host_cost_us(self, fn) -> float:
        """Host time to enqueue one flushed, timed call (the GPU idles meanwhile, so it never blocks)."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        for _ in range(2):
            self.flush.zero_()
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
            torch.cuda._sleep(math.ceil(sleep_us * self.cycles_per_us))
            awake.record()
            for start, end in events:
                self.flush.zero_()
                start.record()
                fn()
                end.record()
            slept_through = not awake.query()  # still asleep: every call was queued before any ran
            torch.cuda.synchronize(self.device)
            if slept_through:
                return [start.elapsed_time(end) * 1e3 for start, end in events]
            sleep_us *= 4
        raise RuntimeError(f"the host could not enqueue {n} calls within a {sleep_us / 4:.0f} us GPU sleep")


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
    del src, dst
    return {"bytes": nbytes, "GBps": bandwidth_GBps(2 * nbytes, stats.mean_us), "time": stats.as_dict()}
