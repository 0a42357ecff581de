"""The benchmark harness end to end on the CPU (tiny shapes; the timings mean
nothing there, this checks the code path and what it writes), the suite summary
arithmetic, and the timer: splitting a device timeline into calls (CPU, on made-up
activities) and both of its methods on a real GPU (marked gpu)."""

import json

import pytest
import torch

from rope_bwd_triton import __main__ as cli
from rope_bwd_triton import bench, suite, timing
from rope_bwd_triton.timing import FLUSH_KERNEL, Activity, ColdL2Timer, split_spans

OURS = ["ours_bwd", "ours_bwd_qk", "ours_bwd_bf16", "ours_fwd", "ours_fwd_bf16"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    files = {"json": out / "bench.json", "markdown": out / "bench.md", "plot": out / "bench.png"}
    argv = ["bench", "--quick", "--device", "cpu", "--peers", "eager,compile,liger,copy", "--seq-lens", "8", "33"]
    for flag, path in files.items():
        argv += [f"--{flag}", str(path)]
    rc = cli.main(argv)
    return rc, files


def test_quick_bench_writes_json_markdown_and_plot(quick_run):
    rc, files = quick_run
    assert rc == 0
    run = json.loads(files["json"].read_text())
    assert run["meta"]["calls"] >= 1 and run["copy"]["GBps"] > 0
    assert [w["S"] for w in run["workloads"]] == [8, 33]
    for w in run["workloads"]:
        assert set(w["floors"]) == set(bench.TASKS)
        for name in [*OURS, "eager_bwd", "compiled_bwd", "compiled_bwd_qk"]:
            r = w["results"][name]
            assert r["verify"]["ok"], (name, r["verify"])
            assert r["verify"]["rows"] == w["S"] and len(r["verify"]["rel_err"]) in (2, 3)
            assert r["time"]["n"] == run["meta"]["calls"] and r["x_floor"] > 0 and r["GBps"] > 0
        assert "skipped" in w["results"]["liger_bwd_qk"]  # needs a CUDA GPU
        for task in bench.TASKS:  # the copy reference moves each task's floor bytes
            r = w["results"][f"copy_{task}"]
            assert r["verify"]["ok"] and r["time"]["n"] == run["meta"]["calls"]
    assert set(run["summary"]["impls"]) >= set(OURS)
    assert run["meta"]["timer_other"] is None and "wall clock" in run["meta"]["timer"]
    # no second figure on the CPU
    assert all(w["results"]["ours_bwd"]["time"]["other"] is None for w in run["workloads"])

    md = files["markdown"].read_text()
    for heading in (
        "Mean over 2 measured workloads",
        "Backward, fp32",
        "Verification",
        "Not measured",
        "| mean us by the other timer |",
    ):
        assert heading in md
    assert "![time and achieved bandwidth against S](bench.png)" in md
    assert files["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_copy_reference_moves_each_tasks_floor_bytes():
    S, H, D = 33, 2, 16
    data = bench.Data(S, H, D, torch.device("cpu"), seed=0)
    for task, (_, mode, dtype) in bench.TASKS.items():
        call = bench._copy(task)(None, data.inputs(mode, dtype))
        call()
        dst, src = call.last
        elem = getattr(torch, dtype).itemsize
        assert 2 * src.numel() == suite.floor_bytes(S, H, D, elem=elem, table_elem=4, mode=mode)
        assert bench._check_copy(call)["ok"]
        dst[7] ^= 1  # a copy that got one byte wrong fails its check
        assert not bench._check_copy(call)["ok"]


def test_rerender_from_saved_runs(quick_run, tmp_path):
    _, files = quick_run
    md, png = tmp_path / "RESULTS.md", tmp_path / "plot.png"
    argv = ["bench", "--from-json", str(files["json"]), str(files["json"]), "--markdown", str(md), "--plot", str(png)]
    assert cli.main(argv) == 0
    text = md.read_text()
    assert "## Run 1:" in text and "## Run 2:" in text and png.exists()
    assert "Cold-L2 check" not in text  # a CPU run has no flush check


def test_markdown_states_the_flush_check(quick_run):
    _, files = quick_run
    run = json.loads(files["json"].read_text())
    run["flush_check"] = {"bytes": 16 << 20, "us": {"fresh": 5.34, "after_evict_last_read": 5.38}, "ratio": 5.38 / 5.34}
    md = bench.render_markdown([run])
    assert (
        "Cold-L2 check: a copy of 16 MiB after the flush takes 5.34 us on fresh buffers and 5.38 us when its "
        "source was read with evict_last priority before (1.01x;"
    ) in md


def test_suite_summary_is_mean_time_over_mean_floor():
    impls = {"ours_bwd": {"label": "ours", "task": "bwd"}, "eager_bwd": {"label": "eager", "task": "bwd"}}
    workloads = []
    for i, S in enumerate(suite.SEQ_LENS):
        floors = {"bwd": {"us": 1.0 + i}}
        results = {"ours_bwd": {"time": {"mean_us": 2.0 * (1 + i), "other": {"mean_us": 1.0 + i}}}}
        if i:  # a peer missing on one workload gets no suite figure
            results["eager_bwd"] = {"time": {"mean_us": 1.0}}
        workloads.append({"set": "suite", "S": S, "floors": floors, "results": results})
    workloads.append(
        {
            "set": "scaling",
            "S": 65536,
            "floors": {"bwd": {"us": 1e6}},
            "results": {"ours_bwd": {"time": {"mean_us": 1.0}}},
        }
    )
    summary = bench.summarize({"impls": impls, "workloads": workloads})
    assert summary["over"] == "the 16 public workloads"
    assert list(summary["impls"]) == ["ours_bwd"]
    s = summary["impls"]["ours_bwd"]
    assert s["mean_us"] == pytest.approx(17.0) and s["floor_us"] == pytest.approx(8.5)
    assert s["x_floor"] == pytest.approx(2.0)
    assert s["other_mean_us"] == pytest.approx(8.5)  # the mean of the other method's figures
    md = "\n".join(bench._suite_table({"meta": {"timer_other": "events"}, "impls": impls, "summary": summary}))
    assert "| mean us by events |" in md and "| 17.0 | 8.5 | 2.00 |  | 8.5 |" in md


# ------------------------------------------------------------------ the timer


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


@pytest.fixture(scope="module")
def gpu_timers():
    return {m: ColdL2Timer("cuda", calls=20, warmup=2, primary=m) for m in timing.METHODS}


SLACK_US = 2.0  # events start once the flush is done, the span at the first kernel: span <= events


@pytest.mark.gpu
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
