"""`bench` end to end on the CPU for each preset (tiny shapes; the timings mean nothing there,
these check the code paths and what they write), the demo (scripts/demo.sh's run, through
get_kernel, every token row verified), the pass rule and the suite summary arithmetic."""

import json
import os
import subprocess
import sys

import pytest
import torch

from rope_bwd_triton import REPO_ROOT, measure, realcall, report, suite
from rope_bwd_triton import __main__ as cli

OURS = ["ours_bwd", "ours_bwd_qk", "ours_bwd_bf16", "ours_fwd", "ours_fwd_bf16"]


def _files(out, stem):
    return {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md", "plot": out / f"{stem}.png"}


def _flags(files):
    return [x for flag, path in files.items() for x in (f"--{flag}", str(path))]


def _bench(*argv, env=None):
    """`python -m rope_bwd_triton bench ...` in a fresh process, as a user runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "rope_bwd_triton", "bench", *argv],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """The suite preset, every peer, and this checkout's build again as an A/B build."""
    files = _files(tmp_path_factory.mktemp("bench"), "bench")
    argv = ["bench", "--quick", "--device", "cpu", "--peers", "eager,compile,liger,copy", "--ab", str(REPO_ROOT)]
    rc = cli.main(argv + ["--seq-lens", "8", "33"] + _flags(files))
    return rc, files


def test_quick_suite_writes_json_markdown_and_plot(quick_run):
    rc, files = quick_run
    assert rc == 0
    run = json.loads(files["json"].read_text())
    assert run["meta"]["calls"] >= 1 and run["copy"]["GBps"] > 0
    assert [w["S"] for w in run["workloads"]] == [8, 33]
    for w in run["workloads"]:
        assert set(w["floors"]) == set(measure.TASKS)
        for name in [*OURS, *(f"ab_{n}" for n in OURS), "eager_bwd", "compiled_bwd", "compiled_bwd_qk"]:
            r = w["results"][name]
            assert r["verify"]["ok"], (name, r["verify"])
            assert r["verify"]["rows"] == w["S"] and len(r["verify"]["rel_err"]) in (2, 3)
            assert r["time"]["n"] == run["meta"]["calls"] and r["x_floor"] > 0 and r["GBps"] > 0
        assert "skipped" in w["results"]["liger_bwd_qk"]  # needs a CUDA GPU
        for task in measure.TASKS:  # the copy reference moves each task's floor bytes
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


def test_demo_loads_through_get_kernel_and_verifies_every_row(tmp_path):
    """scripts/demo.sh's run on two sizes of the public shape (16 heads of 128, fp32 and bf16);
    without a GPU its table shows the verification and the H200 figures, labelled as recorded."""
    files = _files(tmp_path, "demo")
    out = _bench("--preset", "suite", "--tasks", "bwd,bwd_bf16", "--peers", "", "--seq-lens", "3", "17",
                 "--calls", "2", *_flags(files))  # fmt: skip
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (the package's PyTorch path runs;"
    assert "through kernels.get_kernel" in out and f"device: {where}" in out
    assert out.splitlines()[-2].endswith("all pass")
    run = json.loads(files["json"].read_text())
    assert [(w["S"], w["H"], w["D"]) for w in run["workloads"]] == [(3, 16, 128), (17, 16, 128)]
    assert run["meta"]["calls"] == 2 and run["meta"]["command"].startswith("python -m rope_bwd_triton bench ")
    for w in run["workloads"]:
        assert list(w["results"]) == ["ours_bwd", "ours_bwd_bf16"]
        for name, dtype in (("ours_bwd", "float32"), ("ours_bwd_bf16", "bfloat16")):
            r = w["results"][name]
            assert r["verify"]["ok"] and r["verify"]["max_rel_err"] < suite.TOLERANCE[dtype]
            assert r["verify"]["sol_pass_fraction"] == 1.0
            assert r["verify"]["rows"] == w["S"]  # every token row
            assert r["time"]["n"] == 2
    assert files["plot"].stat().st_size > 0
    if not torch.cuda.is_available():
        table = out[out.index("Verification of ours against float64 on this machine") :]
        assert "us/call" not in table and table.count("  yes") == 4  # 2 sizes x 2 dtypes, no timings
        recorded = "recorded on NVIDIA H200 at commit 6e9a4bc, 2026-12-01 20:33 UTC: torch 2.11.0+cu130"
        assert f"Timings of these tasks {recorded}" in table
        assert "ours: rope_bwd(out=) [full backward, fp32]: 20.7 us, 1.14x the byte floor" in table
        assert "q/k-only" not in table  # a task the run did not measure
        assert f"## Timings {recorded}" in files["markdown"].read_text()


def test_copy_reference_moves_each_tasks_floor_bytes():
    S, H, D = 33, 2, 16
    data = measure.Data(S, H, D, torch.device("cpu"), seed=0)
    for task, (_, mode, dtype) in measure.TASKS.items():
        call = measure._copy(task)(None, data.inputs(mode, dtype))
        call()
        dst, src = call.last
        elem = getattr(torch, dtype).itemsize
        assert 2 * src.numel() == suite.floor_bytes(S, H, D, elem=elem, table_elem=4, mode=mode)
        assert measure._check_copy(call)["ok"]
        dst[7] ^= 1  # a copy that got one byte wrong fails its check
        assert not measure._check_copy(call)["ok"]


def test_a_result_passes_within_tolerance_and_sols_rule():
    """Ours passes within the dtype's relative error and with SOL-ExecBench's rule met on >= 99%
    of the elements: either alone fails it."""
    gen = torch.Generator().manual_seed(7)
    ref = torch.randn(64, 4, 16, generator=gen, dtype=torch.float64)
    rows = suite.verify_rows(64, 64, 0)
    assert suite.judge([ref.float()], [ref], "float32", rows)["ok"]
    scaled = suite.judge([ref * (1 + 1e-4)], [ref], "float32", rows)  # every element within SOL's rule
    assert scaled["sol_pass_fraction"] == 1.0 and not scaled["ok"]
    off = ref.clone()
    off.view(-1)[torch.randperm(off.numel(), generator=gen)[: off.numel() // 50]] += 0.1  # 2% of elements
    check = suite.judge([off], [ref], "bfloat16", rows)
    assert check["max_rel_err"] < suite.TOLERANCE["bfloat16"] and check["sol_pass_fraction"] < 0.99
    assert not check["ok"]


def test_verify_rows_keep_the_ends_and_sample_the_rest():
    assert suite.verify_rows(5, 8, 0).tolist() == [0, 1, 2, 3, 4]
    rows = suite.verify_rows(1000, 10, 3)
    assert len(set(rows.tolist())) == 10 and rows[0] == 0 and rows[-1] == 999
    assert rows.tolist() == sorted(rows.tolist()) and rows.tolist() != suite.verify_rows(1000, 10, 4).tolist()


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
    md = report.render_markdown([run])
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
    summary = report.summarize({"impls": impls, "workloads": workloads})
    assert summary["over"] == "the 16 public workloads"
    assert list(summary["impls"]) == ["ours_bwd"]
    s = summary["impls"]["ours_bwd"]
    assert s["mean_us"] == pytest.approx(17.0) and s["floor_us"] == pytest.approx(8.5)
    assert s["x_floor"] == pytest.approx(2.0)
    assert s["other_mean_us"] == pytest.approx(8.5)  # the mean of the other method's figures
    md = "\n".join(report._suite_table({"meta": {"timer_other": "events"}, "impls": impls, "summary": summary}))
    assert "| mean us by events |" in md and "| 17.0 | 8.5 | 2.00 |  | 8.5 |" in md


def test_terminal_table_on_a_gpu():
    """The GPU columns of the table (floor, x floor, GB/s) from a known case: the public S=4096
    workload moves 205.5 MB, 49.9 us at 4.12 TB/s; a 61.0 us call is 1.22x."""
    from rope_bwd_triton.timing import bandwidth_GBps, time_us

    nbytes = suite.floor_bytes(4096)
    assert nbytes == 4 * (6 * 4096 * 16 * 128 + 2 * 4096 * 128)
    floor = time_us(nbytes, 4120.0)
    assert floor == pytest.approx(49.884, abs=0.001)
    check = {"max_rel_err": 7e-8, "sol_pass_fraction": 1.0, "ok": True}
    result = {"time": {"mean_us": 61.0}, "x_floor": 61.0 / floor, "GBps": bandwidth_GBps(nbytes, 61.0), "verify": check}
    run = {
        "meta": {"gpu": "NVIDIA H200"},
        "impls": {"ours_bwd": {"label": "ours", "task": "bwd"}},
        "workloads": [{"set": "suite", "S": 4096, "H": 16, "D": 128, "floors": {"bwd": {"us": floor}},
                       "results": {"ours_bwd": result}}],
    }  # fmt: skip
    run["summary"] = report.summarize(run)
    lines = report.terminal_table(run).splitlines()
    assert lines[2].split() == ["4096", "16", "128", "bwd", "7.00e-08", "100.0%", "61.0", "49.9", "1.22", "3369"]
    assert (
        lines[3]
        == "ours: mean over 1 measured workloads (not the full suite): 61.0 us, floor 49.9 us (1.22x) on NVIDIA H200"
    )
    check["ok"] = False
    assert report.terminal_table(run).splitlines()[2].split()[6:8] == ["61.0", "FAILED"]


def test_quick_realcall_verifies_ours_and_an_ab_build(tmp_path):
    files = _files(tmp_path, "rc")
    argv = ["--preset", "realcall", "--quick", "--peers", "copy,transformers", "--dtypes", "bfloat16", "float16"]
    out = _bench(*argv, "--ab", str(REPO_ROOT), *_flags(files))
    run = json.loads(files["json"].read_text())
    assert {(w["dtype"], w["layout"], w["S"]) for w in run["workloads"]} == {
        (dt, lay, S) for dt in ("bfloat16", "float16") for lay in realcall.LAYOUTS for S in (8, 33)
    }
    for w in run["workloads"]:
        assert set(w["results"]) == {"ours", "ab", "transformers", "copy"}
        assert all(r["verify"]["ok"] for r in w["results"].values())
    md = files["markdown"].read_text()
    assert files["plot"].stat().st_size > 0 and "ours / copy" in md and md in out


def test_quick_realcall_variants(tmp_path):
    """The families' forms: interleaved pairs, partial rotary and bf16 tables, each verified against
    float64; the peers, which serve the halves alone, sit out the first two."""
    files = _files(tmp_path, "rv")
    argv = ["--preset", "realcall", "--quick", "--peers", "copy,transformers", "--layouts", "sdpa"]
    _bench(*argv, "--variants", *realcall.VARIANTS, *_flags(files))
    run = json.loads(files["json"].read_text())
    assert {w["variant"] for w in run["workloads"]} == set(realcall.VARIANTS)
    for w in run["workloads"]:
        peers = {"transformers"} if w["variant"] in ("halves", "bf16-tables") else set()
        assert set(w["results"]) == {"ours", "copy"} | peers
        assert all(r["verify"]["ok"] for r in w["results"].values())


def test_ab_builds_from_before_the_variants_serve_the_halves_alone():
    """An A/B build whose function takes no `interleaved` (from before the interleaved and
    partial forms) is timed on the halves and bf16 tables only, not counted as failing the
    others; a build that takes it is timed on every form."""
    import types

    def old(q, k, cos, sin):
        return q, k

    def new(q, k, cos, sin, *, interleaved=False):
        return q, k

    builds = [types.SimpleNamespace(__name__=n, apply_rotary_pos_emb_vision=f) for n, f in (("old", old), ("new", new))]
    for variant in realcall.VARIANTS:
        impls = realcall.implementations(builds[1], builds, set(), variant)
        both = variant in ("halves", "bf16-tables")
        assert set(impls) == {"ours", "ab2"} | ({"ab"} if both else set()), variant


def test_variant_inputs_are_the_tables_families_build():
    gen = torch.Generator().manual_seed(0)
    x = realcall.make_inputs(5, 2, 8, torch.bfloat16, "sdpa", "cpu", gen, "interleaved")
    assert torch.equal(x["cos"][:, 0::2], x["cos"][:, 1::2])  # each angle twice, side by side
    x = realcall.make_inputs(5, 2, 8, torch.bfloat16, "sdpa", "cpu", gen, "partial")
    assert x["cos"].shape == (5, 6) and torch.equal(x["cos"][:, :3], x["cos"][:, 3:])
    x = realcall.make_inputs(5, 2, 8, torch.bfloat16, "sdpa", "cpu", gen, "bf16-tables")
    assert x["cos"].dtype == x["sin"].dtype == torch.bfloat16


def test_sdpa_layout_is_the_transposed_gradient():
    x = realcall.make_inputs(5, 2, 8, torch.bfloat16, "sdpa", "cpu", torch.Generator().manual_seed(0))
    assert x["gq"].shape == (5, 2, 8) and x["gq"].stride() == (8, 40, 1)
    assert x["q"].stride() == (48, 8, 1) and x["q"].requires_grad and not x["cos"].requires_grad


def test_quick_copybound_in_the_interpreter(tmp_path):
    """Ours and the Triton copies run in Triton's interpreter; every copy is checked against its
    source and ours against float64 inside the command."""
    files = _files(tmp_path, "cb")
    out = _bench("--preset", "copybound", "--quick", *_flags(files), env=dict(os.environ, TRITON_INTERPRET="1"))
    run = json.loads(files["json"].read_text())
    assert run["meta"]["gpu"] is None and run["meta"]["command"].startswith("python -m rope_bwd_triton bench --pre")
    configs = [tuple(c) for c in run["configs"]]
    (w,) = run["workloads"]  # a bench run: ours and the device copy of every task, each verified
    assert set(w["floors"]) == set(w["triton_copy"]) == set(measure.TASKS)
    assert set(w["results"]) == {f"{who}_{task}" for who in ("ours", "copy") for task in measure.TASKS}
    for r in w["results"].values():
        assert r["verify"]["ok"] and r["time"]["n"] == 2 and r["time"]["mean_us"] > 0
    for task, (us, block, warps) in w["triton_copy"].items():
        assert us > 0 and (block, warps) in configs and w["floors"][task]["us"] > 0, task
    assert w["triton_copy"]["fwd"] == w["triton_copy"]["bwd_qk"]  # same floor bytes, timed once
    # one table line per task, printed and in the markdown
    assert sum(line.startswith(tuple(f"| {t} |" for t in measure.TASKS)) for line in out.splitlines()) == 5
    assert "### Copy bound: means over 1 workloads" in files["markdown"].read_text()
