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


# The compile peer through aot_eager, dynamo's graphs without inductor's code generation, on every
# device: these tests check the bench's paths; the records, which time the peer, take inductor
COMPILE = ["--compile-backend", "aot_eager"]

# One timed call in one round: the timings mean nothing on the CPU, and every round repeats the
# warm-up calls (the rotation of the rounds: test_timing.py)
ONE_ROUND = ["--calls", "1", "--rounds", "1"]


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


# The tests of quick_run on one pytest-xdist worker (scripts/test.sh's --dist loadgroup): a
# module's fixture runs once per worker that runs its tests
QUICK_RUN_WORKER = pytest.mark.xdist_group("bench-quick-run")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """The suite preset, every peer, and this checkout's build again as an A/B build."""
    files = _files(tmp_path_factory.mktemp("bench"), "bench")
    argv = ["bench", "--quick", "--device", "cpu", "--peers", "eager,compile,liger,copy", "--ab", str(REPO_ROOT)]
    argv += COMPILE
    rc = cli.main(argv + ["--seq-lens", "8", "33"] + _flags(files))
    return rc, files


@QUICK_RUN_WORKER
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


@QUICK_RUN_WORKER
def test_rerender_from_saved_runs(quick_run, tmp_path):
    _, files = quick_run
    md, png = tmp_path / "RESULTS.md", tmp_path / "plot.png"
    argv = ["bench", "--from-json", str(files["json"]), str(files["json"]), "--markdown", str(md), "--plot", str(png)]
    assert cli.main(argv) == 0
    text = md.read_text()
    assert "## Run 1:" in text and "## Run 2:" in text and png.exists()
    assert "Cold-L2 check" not in text  # a CPU run has no flush check


@QUICK_RUN_WORKER
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
    out = _bench(*argv, *ONE_ROUND, "--ab", str(REPO_ROOT), *_flags(files))
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
    _bench(*argv, *ONE_ROUND, "--variants", *realcall.VARIANTS, *_flags(files))
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


@pytest.mark.cpu_only  # the interpreter's run, on CPU tensors (on a GPU machine bench would pick CUDA)
def test_quick_copybound_in_the_interpreter(tmp_path):
    """Ours and the Triton copies run in Triton's interpreter; every copy is checked against its
    source and ours against float64 inside the command."""
    files = _files(tmp_path, "cb")
    out = _bench(
        "--preset", "copybound", "--quick", "--rounds", "1", *_flags(files), env=dict(os.environ, TRITON_INTERPRET="1")
    )
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


# ------------------------------------------------------------------ the decoder preset


def _decoder_args(*argv):
    import argparse

    from rope_bwd_triton import bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return bench.resolve(parser.parse_args(["--preset", "decoder", "--device", "cpu", *argv]))


def test_decoder_preset_shapes_and_bytes():
    """Llama-3-8B's and Qwen3-Omni's Thinker's heads, B 1 and 4, S 2048 to 32768, bf16, sdpa's gradient;
    the floor counts q, k, cos, sin and the outputs once per direction (bf16 tables)."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeThinkerConfig

    text = Qwen3OmniMoeThinkerConfig().text_config
    thinker = (text.num_attention_heads, text.num_key_value_heads, 128)
    todo = realcall.workloads(_decoder_args())
    assert {(shape, B, S) for _, _, shape, _, B, S in todo} == {
        (shape, B, S)
        for shape in (("llama3-8b", 32, 8, 128), ("qwen3-omni-thinker", *thinker))
        for B in (1, 4)
        for S in (2048, 8192, 32768)
    }
    assert {(v, dt, lay) for v, dt, _, lay, _, _ in todo} == {("halves", "bfloat16", "sdpa")}
    B, S, HQ, HK, D = 4, 32768, 32, 8, 128  # the largest Llama case, in closed form
    heads, tables = B * S * (HQ + HK) * D * 2, 2 * B * S * D * 2

    def meta(*shape):
        return torch.empty(*shape, dtype=torch.bfloat16, device="meta")

    x = dict(q=meta(B, HQ, S, D), k=meta(B, HK, S, D), gq=meta(B, HQ, S, D), gk=meta(B, HK, S, D), cos=meta(B, S, D),
             sin=meta(B, S, D))  # fmt: skip
    assert realcall.floor_bytes(x) == {"fwd": 2 * heads + tables, "bwd": 2 * heads + tables}


def test_decoder_inputs_are_the_attentions_views(gen):
    x = realcall.make_decoder_inputs(2, 5, 4, 2, 8, torch.bfloat16, "sdpa", "cpu", gen)
    assert x["q"].shape == (2, 4, 5, 8) and x["q"].stride() == (160, 8, 32, 1) and x["q"].requires_grad
    assert x["k"].shape == (2, 2, 5, 8) and x["k"].stride() == (80, 8, 16, 1) and x["k"].requires_grad
    assert x["gq"].is_contiguous() and x["gk"].shape == (2, 2, 5, 8)  # sdpa's gradient
    assert x["cos"].shape == (2, 5, 8) and x["cos"].dtype == torch.bfloat16 and not x["cos"].requires_grad
    assert torch.equal(x["cos"][..., :4], x["cos"][..., 4:])  # cat(freqs, freqs)
    flash = realcall.make_decoder_inputs(2, 5, 4, 2, 8, torch.bfloat16, "flash", "cpu", gen)
    assert flash["gq"].stride() == (160, 8, 32, 1)  # [B, S, H, D] seen as [B, H, S, D]
    copies = realcall.private_copy(x)
    assert all(copies[n].stride() == x[n].stride() and torch.equal(copies[n], x[n]) for n in x)
    assert copies["q"].requires_grad and copies["q"].data_ptr() != x["q"].data_ptr()


def test_decoder_verification_catches_a_wrong_rotary(gen):
    """The decoders' function passes on rows (b, s) against float64; the same with sin negated, or
    judged on the wrong rows, fails."""
    from rope_bwd_triton.models import decoder_rotary

    B, S = 3, 7
    x = realcall.make_decoder_inputs(B, S, 4, 2, 16, torch.float16, "sdpa", "cpu", gen)
    rows = suite.verify_rows(B * S, 8, 0)
    refs = realcall.reference(x, rows, S=S)

    def judged(fn, pick=rows):
        call = realcall.FwdBwd(fn, x)
        call()
        every = torch.arange(len(rows))
        return suite.judge([realcall.pick_rows(t, pick, S) for t in call.last], refs, "float16", every)["ok"]

    rotary = decoder_rotary()
    assert judged(rotary)
    assert not judged(lambda q, k, cos, sin: rotary(q, k, cos, -sin))
    assert not judged(rotary, pick=(rows + 1) % (B * S))


def test_quick_decoder_preset_with_peers(tmp_path):
    """ours, transformers' eager function, torch.compile of it and the copy, each verified against
    float64 on the decoders' call; the table gives ours over the copy and each peer over ours."""
    files = _files(tmp_path, "dec")
    # one batch size (each shape is one compilation of the peer on the CPU); the batches: test_quick_decode_preset
    argv = ["--preset", "decoder", "--quick", "--models", "llama3-8b", "--seq-lens", "33", "--batches", "2"]
    _bench(*argv, "--layouts", "sdpa", "flash", *ONE_ROUND, "--peers", "copy,transformers,compile", *COMPILE,
           *_flags(files))  # fmt: skip
    run = json.loads(files["json"].read_text())
    assert {(w["model"], w["H"], w["HK"], w["D"], w["B"], w["layout"]) for w in run["workloads"]} == {
        ("llama3-8b", 32, 8, 128, 2, lay) for lay in ("sdpa", "flash")
    }
    for w in run["workloads"]:
        assert set(w["results"]) == {"ours", "transformers", "compile", "copy"}
        for name, r in w["results"].items():
            assert r["verify"]["ok"], (name, r["verify"])
            assert name == "copy" or r["verify"]["rows"] == min(2048, w["B"] * w["S"])
        assert w["bytes"] == 2 * (2 * w["B"] * 33 * 40 * 128 * 2 + 2 * w["B"] * 33 * 128 * 2)
    assert run["labels"]["ours"] == "ours"
    md = files["markdown"].read_text()
    assert "| model | heads | B | dtype | grad layout | S | ours us |" in md
    assert "| ours / copy |" in md and "| transformers / ours |" in md and "| compile / ours |" in md
    assert "| llama3-8b | 32/8 x 128 | 2 | bfloat16 | flash | 33 |" in md


def test_quick_decoder_liger_in_the_interpreter(tmp_path):
    """Liger-Kernel's liger_rotary_pos_emb, which rotates its inputs in place, on copies of its own:
    verified against float64 in Triton's interpreter (float16: the interpreter's bfloat16 gives NaN),
    and transformers' function, verified after it, still sees fresh inputs."""
    pytest.importorskip("liger_kernel", reason="liger-kernel is not installed")
    files = _files(tmp_path, "liger")
    argv = ["--preset", "decoder", "--quick", "--models", "qwen3-omni-thinker", "--seq-lens", "8", "--batches", "1"]
    argv += ONE_ROUND  # each call of the thinker's heads takes seconds in the interpreter
    env = dict(os.environ, TRITON_INTERPRET="1")
    # one gradient layout: the in-place rotation on copies, checked here, is the same for both
    _bench(*argv, "--dtypes", "float16", "--layouts", "sdpa", "--peers", "liger,transformers", *_flags(files), env=env)
    run = json.loads(files["json"].read_text())
    assert len(run["workloads"]) == 1
    for w in run["workloads"]:
        assert list(w["results"]) == ["ours", "liger", "transformers"]  # the order of the verification
        assert all(r["verify"]["ok"] for r in w["results"].values()), w["results"]


def test_quick_decode_preset(tmp_path):
    """A generation step's call, forward only under no grad: S = 1 at every batch, the prefill at
    B = 1, ours and transformers' function verified against float64 (forward values); GPU and wall
    time per call in the table; --untuned recorded."""
    files = _files(tmp_path, "decode")
    _bench("--preset", "decode", "--quick", "--models", "llama3-8b", "--peers", "transformers", "--untuned",
           *_flags(files))  # fmt: skip
    run = json.loads(files["json"].read_text())
    assert run["meta"]["preset"] == "decode" and run["meta"]["tuned_tables"] is False
    assert [(w["B"], w["S"]) for w in run["workloads"]] == [(1, 1), (1, 8), (2, 1)]
    for w in run["workloads"]:
        assert list(w["results"]) == ["ours", "transformers"]
        for r in w["results"].values():
            assert r["verify"]["ok"] and len(r["verify"]["rel_err"]) == 2, r["verify"]  # the outputs alone
            assert r["time"]["wall_us"] > 0 and r["time"]["mean_us"] > 0
    md = files["markdown"].read_text()
    assert "| model | heads | B | dtype | grad layout | S | ours us | ours wall us |" in md
    assert "| transformers (eager) us | transformers / ours | transformers (eager) wall us |" in md
    assert "| llama3-8b | 32/8 x 128 | 2 | bfloat16 | none | 1 |" in md


def test_plain_function_unwraps_kernels_hub_decorator():
    from kernels import use_kernel_forward_from_hub

    from rope_bwd_triton.models import plain_function

    def rotary(q, k, cos, sin, unsqueeze_dim=1):
        return q, k

    assert plain_function(rotary) is rotary
    assert plain_function(use_kernel_forward_from_hub("rotary_pos_emb")(rotary)) is rotary
    with pytest.raises(TypeError, match="not a function"):
        plain_function(torch.nn.Linear(1, 1))


def test_thinker_heads_fall_back_where_transformers_lacks_the_config(monkeypatch):
    import builtins

    from rope_bwd_triton import models

    real_import = builtins.__import__

    def without_omni(name, *args, **kwargs):
        if "qwen3_omni_moe" in name:
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_omni)
    assert models.thinker_heads() == models.THINKER_FALLBACK == (28, 4, 128)


def test_quick_families_preset(tmp_path):
    """GPT-OSS's, DeepSeek-V4's and DINOv3's own calls at their released heads (DeepSeek-V4's of 512
    channels), ours and each family's own function, eager and compiled, verified against the
    family's function in float64; DINOv3's prefix tokens in the call."""
    files = _files(tmp_path, "fam")
    # one length: each shape is one compilation of each family's function on the CPU
    _bench("--preset", "families", "--quick", "--seq-lens", "8", *ONE_ROUND, "--peers", "copy,transformers,compile",
           *COMPILE, *_flags(files))  # fmt: skip
    run = json.loads(files["json"].read_text())
    assert {(w["model"], w["H"], w["HK"], w["D"]) for w in run["workloads"]} == {
        ("gpt-oss", 64, 8, 64), ("deepseek-v4", 64, 1, 512), ("dinov3-vitl", 16, 16, 64)
    }  # fmt: skip
    for w in run["workloads"]:
        assert set(w["results"]) == {"ours", "transformers", "compile", "copy"}
        assert all(r["verify"]["ok"] for r in w["results"].values()), w["results"]
    assert "| gpt-oss | 64/8 x 64 | 1 | bfloat16 | sdpa | 8 |" in files["markdown"].read_text()
