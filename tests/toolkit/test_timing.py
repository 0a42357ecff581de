"""The timer: splitting a device timeline into calls (CPU, on made-up activities), the CPU
stand-in, taking turns, and both of its methods on a real GPU (marked gpu)."""

import pytest
import torch

from rope_bwd_triton import timing
from rope_bwd_triton.timing import FLUSH_KERNEL, Activity, ColdL2Timer, split_spans


def _act(name, start, end, stream=7):
    return Activity(name, start, end, stream)


def test_split_spans_covers_every_activity_between_flushes():
    acts = [
        _act("sleep_before_the_first_flush", 0, 5),  # not ours: ignored
        _act(FLUSH_KERNEL, 10, 20),
        _act("kernel_a", 21, 25),
        _act("Memcpy DtoD (Device -> Device)", 26, 30),
        _act("kernel_b", 31, 40),
        _act(FLUSH_KERNEL, 50, 60),  # nothing ran after this one
        _act(FLUSH_KERNEL, 70, 80),
        _act("Memset (Device)", 82, 83),
    ]
    # given in any order: the timeline is sorted by start
    assert split_spans(list(reversed(acts)), 3) == [pytest.approx(19), None, pytest.approx(1)]


@pytest.mark.parametrize("case", ["empty", "fewer flushes", "more flushes", "other stream"])
def test_split_spans_refuses_a_timeline_it_cannot_attribute(case):
    acts = [_act(FLUSH_KERNEL, 0, 1), _act("k", 2, 3), _act(FLUSH_KERNEL, 4, 5), _act("k", 6, 7)]
    flushes, match = {
        "empty": (2, "no GPU activity"),
        "fewer flushes": (3, "cannot be split"),
        "more flushes": (1, "cannot be split"),
        "other stream": (2, "another stream"),
    }[case]
    if case == "empty":
        acts = []
    if case == "other stream":
        acts.append(_act("side", 6.5, 9, stream=8))
    with pytest.raises(RuntimeError, match=match):
        split_spans(acts, flushes)


def test_cpu_timer_is_wall_clock_with_no_second_figure():
    timer = ColdL2Timer("cpu", calls=3, warmup=0, primary="span")
    stats = timer(lambda: None)
    assert stats.n == 3 and stats.other is None and timer.other is None
    assert stats.as_dict()["other"] is None
    with pytest.raises(ValueError, match="primary"):
        ColdL2Timer("cpu", primary="nvtx")
    with pytest.raises(ValueError, match="needs the profiler"):
        ColdL2Timer("cpu", primary="span", profile=False)


def test_interleave_takes_turns_round_by_round():
    order = []
    out = timing.interleave({"a": 0, "b": 0, "c": 0}, lambda name: order.append(name) or len(order), 2)
    assert "".join(order) == "abc" + "abc" and out == {"a": [1, 4], "b": [2, 5], "c": [3, 6]}
    order.clear()
    timing.interleave("abc", order.append, 3, rotate=True)
    assert "".join(order) == "abc" + "bca" + "cab"


def test_in_rounds_times_every_call_its_share_in_rotating_turns():
    """A/B runs time ours and the other builds in turns: 7 calls over 3 rounds are 3 + 2 + 2 timed
    calls each (after the warm-up), each round one name later; a call that raises loses only its
    own figure."""
    timer = ColdL2Timer("cpu", calls=7, warmup=1)
    order = []

    def call(name):
        def fn():
            order.append(name)
            if name == "c" and order.count("c") == 5:  # its first call of the second round
                raise RuntimeError("c broke")

        return fn

    out = timer.in_rounds({n: call(n) for n in "abc"}, rounds=3)
    # 1 warm-up call and the round's share; the third round starts at c, which has dropped out
    assert "".join(order) == "aaaabbbbcccc" + "bbbcaaa" + "aaabbb"
    assert (out["a"].n, out["b"].n) == (7, 7)
    assert isinstance(out["c"], RuntimeError)
    assert timer.in_rounds({}, rounds=3) == {}


@pytest.fixture(scope="module")
def gpu_timers():
    return {m: ColdL2Timer("cuda", calls=20, warmup=2, primary=m) for m in timing.METHODS}


SLACK_US = 2.0  # events start once the flush is done, the span at the first kernel: span <= events


@pytest.mark.gpu
@pytest.mark.whole_gpu  # timing ratios: no other test's kernels beside them
def test_span_of_one_known_kernel(gpu_timers):
    src = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    stats = gpu_timers["span"](lambda: dst.copy_(src))  # one copy kernel, ~0.1 ms
    events = stats.other
    assert stats.n == events.n == 20
    assert stats.min_us > 0
    assert stats.mean_us <= events.mean_us + SLACK_US and stats.max_us <= events.max_us + SLACK_US
    assert stats.mean_us >= 0.8 * events.mean_us  # one kernel: the events add only the launch latency
    swapped = gpu_timers["events"](lambda: dst.copy_(src))
    assert swapped.other.mean_us <= swapped.mean_us + SLACK_US  # primary events, span alongside
    alone = ColdL2Timer("cuda", calls=20, warmup=2, profile=False)(lambda: dst.copy_(src))
    assert alone.n == 20 and alone.other is None and alone.min_us > 0


@pytest.mark.gpu
@pytest.mark.whole_gpu  # timing ratios: no other test's kernels beside them
def test_span_of_a_multi_kernel_call_covers_all_of_it(gpu_timers):
    timer = gpu_timers["span"]
    cycles = int(100 * timer.cycles_per_us)  # ~100 us of GPU sleep: kernels of a known length
    a = torch.ones(1 << 20, device="cuda")
    b = torch.empty_like(a)

    def multi():  # kernel, memcpy, kernel, kernel: the span must reach from the first to the last
        torch.cuda._sleep(cycles)
        b.copy_(a)
        torch.cuda._sleep(cycles)
        b.add_(1)

    one = timer(lambda: torch.cuda._sleep(cycles))
    stats = timer(multi)
    assert stats.n == stats.other.n == 20  # one span per call
    # the median sleep: another process's kernels delay some calls, which moved the mean by 13%
    assert stats.min_us >= 1.9 * one.median_us
    assert stats.mean_us <= stats.other.mean_us + SLACK_US

    # the profiler's view of the same calls: each segment holds all four activities, the memcpy too
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            timer._zero()
            multi()
        torch.cuda.synchronize()
    acts = sorted(timing._gpu_activities(prof), key=lambda x: x.start)
    names = [x.name for x in acts]
    assert names.count(FLUSH_KERNEL) == 3 and len(acts) == 3 * 5, names
    assert sum("memcpy" in n.lower() for n in names) == 3, names
    spans = split_spans(acts, 3)
    assert all(s >= 1.9 * one.mean_us for s in spans)


@pytest.mark.gpu
@pytest.mark.whole_gpu  # timing ratios: no other test's kernels beside them
def test_flush_evicts_lines_of_evict_last_priority(gpu_timers):
    """The timer's flush leaves a copy as slow after an evict_last read of its source as on fresh
    buffers (kernel spans: CUDA events would add the launch latency to both)."""
    assert timing.flush_check(gpu_timers["span"])["ratio"] >= 0.93


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["extra flush", "no GPU work", "other stream"])
def test_span_refuses_calls_it_cannot_segment(gpu_timers, case):
    timer = gpu_timers["span"]
    x = torch.empty(1 << 20, device="cuda")
    side = torch.cuda.Stream()

    def other_stream():
        with torch.cuda.stream(side):
            x.zero_()

    fn, match = {
        "extra flush": (timer._zero, "cannot be split"),
        "no GPU work": (lambda: None, "no GPU work"),
        "other stream": (other_stream, "another stream"),
    }[case]
    with pytest.raises(RuntimeError, match=match):
        timer(fn)
    torch.cuda.synchronize()
