"""The benchmark harness end to end on the CPU (tiny shapes; the timings mean
nothing there, this checks the code path and what it writes), and the suite
summary arithmetic."""

import json

import pytest

from rope_bwd_triton import __main__ as cli
from rope_bwd_triton import bench, suite

OURS = ["ours_bwd", "ours_bwd_qk", "ours_bwd_bf16", "ours_fwd", "ours_fwd_bf16"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    files = {"json": out / "bench.json", "markdown": out / "bench.md", "plot": out / "bench.png"}
    argv = ["bench", "--quick", "--device", "cpu", "--peers", "eager,compile,liger", "--seq-lens", "8", "33"]
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
    assert set(run["summary"]["impls"]) >= set(OURS)

    md = files["markdown"].read_text()
    for heading in ("Mean over 2 measured workloads", "Backward, fp32", "Verification", "Not measured"):
        assert heading in md
    assert "![time and achieved bandwidth against S](bench.png)" in md
    assert files["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rerender_from_saved_runs(quick_run, tmp_path):
    _, files = quick_run
    md, png = tmp_path / "RESULTS.md", tmp_path / "plot.png"
    argv = ["bench", "--from-json", str(files["json"]), str(files["json"]), "--markdown", str(md), "--plot", str(png)]
    assert cli.main(argv) == 0
    text = md.read_text()
    assert "## Run 1:" in text and "## Run 2:" in text and png.exists()


def test_suite_summary_is_mean_time_over_mean_floor():
    impls = {"ours_bwd": {"label": "ours", "task": "bwd"}, "eager_bwd": {"label": "eager", "task": "bwd"}}
    workloads = []
    for i, S in enumerate(suite.SEQ_LENS):
        floors = {"bwd": {"us": 1.0 + i}}
        results = {"ours_bwd": {"time": {"mean_us": 2.0 * (1 + i)}}}
        if i:  # a peer missing on one workload gets no suite figure
            results["eager_bwd"] = {"time": {"mean_us": 1.0}}
        workloads.append({"set": "suite", "S": S, "floors": floors, "results": results})
    workloads.append({"set": "scaling", "S": 65536, "floors": {"bwd": {"us": 1e6}},
                      "results": {"ours_bwd": {"time": {"mean_us": 1.0}}}})
    summary = bench.summarize({"impls": impls, "workloads": workloads})
    assert summary["over"] == "the 16 public workloads"
    assert list(summary["impls"]) == ["ours_bwd"]
    s = summary["impls"]["ours_bwd"]
    assert s["mean_us"] == pytest.approx(17.0) and s["floor_us"] == pytest.approx(8.5)
    assert s["x_floor"] == pytest.approx(2.0)
