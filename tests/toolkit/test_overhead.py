"""`overhead` on the CPU: its reports from made-up runs (the measuring needs a CUDA GPU), and the
one-line refusal without one."""

import json
import os
import subprocess
import sys

import torch

from rope_bwd_triton import REPO_ROOT, firstcall, hosttime

META = {"heads": 16, "head_dim": 72, "rounds": 3, "gpu": "G", "date": "D", "sizes": [9, 10, 11]}
META["versions"] = {"torch": "t", "triton": "tr"}


def _cells(table, first):
    line = next(line for line in table.splitlines() if line.startswith(f"| {first} |"))
    return [c.strip() for c in line.split("|")[1:-1]]


def test_overhead_needs_a_gpu(tmp_path):
    """The message on a machine without CUDA (a GPU hidden from the process where there is one)."""
    proc = subprocess.run(
        [sys.executable, "-m", "rope_bwd_triton", "overhead", "--json", str(tmp_path / "o.json")],
        cwd=REPO_ROOT,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.json").exists()


def test_first_calls_rotate_the_order_and_report_medians_over_rounds():
    """Each round runs every implementation once, the first place taken in turn (no
    implementation always runs first); a row gives the median over rounds and the range."""
    assert firstcall.rounds(["a", "b", "c"], 3) == [
        (0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a"), (2, "c"), (2, "a"), (2, "b"),
    ]  # fmt: skip

    def run(impl, first_ms, load_s, new_ms, again_ms, compiles=None):
        calls = [{"S": 9, "ms": first_ms, "new": True, "compiles": compiles and [["k", 0.1]] * compiles}]
        calls += [{"S": 10 + i, "ms": ms, "new": True, "compiles": compiles and []} for i, ms in enumerate(new_ms)]
        calls.append({"S": 10, "ms": again_ms, "new": False, "compiles": compiles and []})
        return {"impl": impl, "load_s": load_s, "calls": calls}

    runs = [
        run("ours", 1600.0, 4.0, [0.6, 4.4], 1.0, compiles=2),
        run("ours", 530.0, 5.0, [0.8], 0.9, compiles=2),
        run("ours", 560.0, 4.5, [0.7, 0.65], 1.1, compiles=2),
        run("liger", 1900.0, 11.0, [1.5], 1.9),
        {"impl": "liger", "error": "RuntimeError: no GPU"},
        run("liger", 520.0, 8.0, [1.7, 185.0], 1.7),
    ]
    table = firstcall.markdown(runs, META)
    assert _cells(table, "ours") == [
        "ours", "4500 (4000-5000)", "560 (530-1600)", "0.7 (0.6-4.4)", "1.00 (0.90-1.10)", "2 then 0", "",
    ]  # fmt: skip
    assert _cells(table, "liger") == [
        "liger", "9500 (8000-11000)", "1210 (520-1900)", "1.7 (1.5-185.0)", "1.80 (1.70-1.90)", "—",
        "1 of 3 runs failed: RuntimeError: no GPU",
    ]  # fmt: skip
    assert "3 round(s) in rotated order" in table


def test_host_time_sets_the_fast_launch_settings_side_by_side():
    runs = {
        "on": {"rows": {"a": [1.25, 1.0], "b": [3.0, 2.5]}, "new_size": {"ours": [9.0, 8.0], "transformers": [7, 6]}},
        "off": {"rows": {"a": [2.0, 1.75]}, "new_size": {"ours": [12.0, 11.0], "transformers": [7.5, 6.5]}},
        "broken": {"error": "RuntimeError: boom"},
    }
    table = hosttime.markdown(runs, META)
    assert "| call | fast launch on: median us | fast launch on: best us | fast launch off: median us |" in table
    assert _cells(table, "a") == ["a", "1.2", "1.0", "2.0", "1.8"]
    assert _cells(table, "b") == ["b", "3.0", "2.5", "nan", "nan"]  # a row only one setting has
    assert _cells(table, "ours") == ["ours", "9.0", "8.0", "12.0", "11.0"]
    assert table.rstrip().endswith("fast launch broken: RuntimeError: boom")


def _stand_in(monkeypatch, child):
    """The parent on the CPU: a GPU as far as it asks, no build, `child` for every fresh process."""
    from rope_bwd_triton import load, output, overhead

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(load, "use_local_build", lambda: None)
    monkeypatch.setattr(output, "run_meta", lambda device, **fields: {**META, **fields})
    monkeypatch.setattr(overhead, "run_fresh", child)


def test_each_child_runs_fresh_with_its_own_settings(monkeypatch, tmp_path, capsys):
    """The parent's work, its children stood in for: a fresh process per implementation and
    round (first calls), one per fast-launch setting with ROPE_BWD_FAST_LAUNCH set (host), then
    the JSON and the markdown of both parts."""
    from rope_bwd_triton import __main__ as toolkit

    started = []

    def child(argv, workdir, name, **env):
        started.append((argv[argv.index("--child") + 1], name, env))
        if "host" in argv:
            return {"rows": {"a": [1.0, 0.5]}, "new_size": {"ours": [3.0, 2.0], "transformers": [4.0, 3.0]}}
        calls = [{"S": S, "ms": 1.0, "new": S != 64, "compiles": None} for S in (16, 36, 64, 64)]
        return {"impl": argv[-1], "load_s": 0.5, "calls": calls}

    _stand_in(monkeypatch, child)
    out = tmp_path / "o.json"
    argv = ["overhead", "--impls", "ours,liger", "--rounds", "2", "--sizes", "16", "36", "64", "--json", str(out)]
    assert toolkit.main(argv) == 0
    assert started == [
        ("ours", "ours-0", {}), ("liger", "liger-0", {}), ("liger", "liger-1", {}), ("ours", "ours-1", {}),
        ("host", "host-on", {"ROPE_BWD_FAST_LAUNCH": "1"}), ("host", "host-off", {"ROPE_BWD_FAST_LAUNCH": "0"}),
    ]  # fmt: skip
    saved = json.loads(out.read_text())
    assert [r["round"] for r in saved["first_call"]] == [0, 0, 1, 1] and set(saved["host"]) == {"on", "off"}
    md = out.with_suffix(".md").read_text()
    assert _cells(md, "ours")[:3] == ["ours", "500 (500-500)", "1 (1-1)"] and md in capsys.readouterr().out
    assert _cells(md, "a") == ["a", "1.0", "0.5", "1.0", "0.5"]


def test_ab_build_joins_both_parts(monkeypatch, tmp_path):
    """--ab: the other build runs as one more implementation of the first calls, and every child
    is told where it is (the host child times it beside ours)."""
    from rope_bwd_triton import __main__ as toolkit

    started = []

    def child(argv, workdir, name, **env):
        started.append((argv[argv.index("--child") + 1], argv[argv.index("--ab") + 1]))
        if "host" in argv:
            return {"rows": {"a": [1.0, 0.5]}, "new_size": {"ours": [3.0, 2.0], "ab": [4.0, 3.0]}}
        calls = [{"S": S, "ms": 1.0, "new": S != 64, "compiles": None} for S in (16, 36, 64, 64)]
        return {"impl": argv[-1], "load_s": 0.5, "calls": calls}

    _stand_in(monkeypatch, child)
    out = tmp_path / "o.json"
    argv = [
        "overhead",
        "--impls",
        "ours",
        "--rounds",
        "1",
        "--sizes",
        "16",
        "36",
        "64",
        "--ab",
        "/x/base",
        "--json",
        str(out),
    ]
    assert toolkit.main(argv) == 0
    assert started == [("ours", "/x/base"), ("ab", "/x/base"), ("host", "/x/base"), ("host", "/x/base")]
    md = out.with_suffix(".md").read_text()
    assert _cells(md, "ab")[0] == "ab" and len(_cells(md, "ab")) > 3
