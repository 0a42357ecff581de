"""`results` (results.py): RESULTS.md's GPU sections and the README's performance table come from
the release records in benchmarks/<gpu>/, here the recorded files themselves, and a release
run's summary (scripts/gpu.sh release) from its logs."""

import argparse
import json
import shutil

import pytest

from rope_bwd_triton import REPO_ROOT, output, publish, results

H100, H200 = REPO_ROOT / "benchmarks" / "h100", REPO_ROOT / "benchmarks" / "h200"


def run(root, *options) -> int:
    parser = argparse.ArgumentParser()
    results.add_arguments(parser)
    return results.main(parser.parse_args(["--root", str(root), *options]))


@pytest.fixture
def tree(tmp_path):
    """A copy of what the command reads and writes: README.md, CARD.md, benchmarks/ (records of
    the release stage's names only, its release.json too)."""
    for name in ("README.md", "CARD.md"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    shutil.copy(REPO_ROOT / "benchmarks" / "RESULTS.md", (tmp_path / "benchmarks").mkdir() or tmp_path / "benchmarks")
    for gpu in ("h100", "h200"):
        (tmp_path / "benchmarks" / gpu).mkdir()
        for path in (REPO_ROOT / "benchmarks" / gpu).glob("*.json"):
            if path.stem in results.RECORDS or path.stem == "release":
                shutil.copy(path, tmp_path / "benchmarks" / gpu)
    return tmp_path


def cells(readme: str) -> dict:
    """The performance table: {workload: [cell per GPU]}."""
    table = readme.split("<!-- performance:start -->")[1].split("<!-- performance:end -->")[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.strip().splitlines()[2:]]
    return {row[0]: row[1:] for row in rows}


def test_the_committed_files_are_the_records(tree):
    """RESULTS.md, the README and the card say what the recorded files give (no figure written
    by hand): the command on a copy changes nothing, and --check agrees."""
    assert run(tree, "--check") == 0
    assert run(tree) == 0
    for name in ("README.md", "CARD.md", "benchmarks/RESULTS.md"):
        assert (tree / name).read_text() == (REPO_ROOT / name).read_text(), name


def test_figures_come_from_the_records_and_name_their_commit(tree):
    (tree / "benchmarks" / "RESULTS.md").write_text(
        (tree / "benchmarks" / "RESULTS.md").read_text().replace("| 20.7 |", "| 19.0 |")
    )
    assert run(tree, "--check") == 1  # a figure edited by hand is caught
    assert run(tree) == 0 and run(tree, "--check") == 0
    h100, h200 = cells((tree / "README.md").read_text())["SOL-ExecBench 019, fp32 backward, mean of the 16 workloads"]
    suite = json.loads((H100 / "bench.json").read_text())["summary"]["impls"]
    ours, copy = suite["ours_bwd"]["mean_us"], suite["copy_bwd"]["mean_us"]
    assert h100 == f"{ours:.1f} us; copy {copy:.1f}"  # of the release's own commit: no mark
    suite = json.loads((H200 / "bench.json").read_text())["summary"]["impls"]
    ours, copy = suite["ours_bwd"]["mean_us"], suite["copy_bwd"]["mean_us"]
    assert h200.startswith(f"{ours:.1f} us; copy {copy:.1f}, ") and h200.endswith(" (at 6e9a4bc)")
    decoder = cells((tree / "README.md").read_text())[results.ROWS[2][0]][1]
    assert decoder.endswith("(commit not recorded)")  # H200's, recorded before run_meta named its commit
    assert (tree / "CARD.md").read_text() == publish.render_card((tree / "README.md").read_text())
    text = (tree / "benchmarks" / "RESULTS.md").read_text()
    assert "Raw: `h200/decoder.json` (commit not recorded)." in text
    h200_section = text.split("<!-- results:h200:start -->")[1]
    assert "### GPT-OSS's, DeepSeek-V4's and DINOv3's own calls\n\nNot measured yet on this GPU." in h200_section


def test_a_release_marks_only_what_is_of_another_commit(tree):
    """With a release.json, its commit heads the GPU's column; the records of that commit carry
    no mark, one of another commit names it."""
    folder = tree / "benchmarks" / "h200"
    for name, commit in (("bench", "1234567"), ("realcall", "1234567"), ("decoder", "7654321")):
        record = json.loads((folder / f"{name}.json").read_text())
        record["meta"]["commit"] = commit
        (folder / f"{name}.json").write_text(json.dumps(record))
    counts = {"exit": 0, "passed": 1377, "skipped": 1}
    release = {"commit": "1234567", "gpu": "NVIDIA H200", "seconds": 541, "tests": counts,
               "whole_gpu_tests": {"exit": 0, "passed": 3}, "records": ["bench"], "records_run": 1}  # fmt: skip
    (folder / "release.json").write_text(json.dumps(release))
    assert run(tree) == 0
    readme = (tree / "README.md").read_text()
    assert "| NVIDIA H200 (release 1234567) |" in readme
    row = cells(readme)
    assert "(at" not in row[results.ROWS[0][0]][1] and "(at" not in row[results.ROWS[1][0]][1]
    assert row[results.ROWS[2][0]][1].endswith(" (at 7654321)")
    text = (tree / "benchmarks" / "RESULTS.md").read_text()
    assert "release of 1234567 on NVIDIA H200: tests 1377 passed, 0 failed, 1 skipped; whole_gpu tests 3 passed" in text


def test_markers_are_required(tree):
    (tree / "README.md").write_text((tree / "README.md").read_text().replace("<!-- performance:end -->", ""))
    with pytest.raises(results.cli.UsageError, match="README.md needs one"):
        run(tree)


@pytest.mark.parametrize(
    "tail,status,said",
    [
        ("== 12 passed, 2 skipped, 3 warnings in 9.1s ==", 0, "12 passed, 0 failed, 2 skipped"),
        ("3 failed, 9 passed, 1 error in 4.0s", 1, "9 passed, 3 failed, 1 errors, 0 skipped"),
        ("[ 40%] ........", 124, "cut short"),
    ],
)
def test_pytest_counts_of_a_log(tmp_path, tail, status, said):
    log = tmp_path / "tests.log"
    log.write_text(f"header\n1 passed in 0.1s (an earlier line)\n{tail}\n" if status != 124 else f"{tail}\n")
    assert results._said(results.pytest_counts(log, status)) == said


def test_records_name_the_commit_given_or_the_checkouts(monkeypatch):
    monkeypatch.setenv("ROPE_COMMIT", "abcdef1")
    assert output.commit() == "abcdef1"
    monkeypatch.delenv("ROPE_COMMIT")
    commit = output.commit()
    assert commit is None or len(commit.removesuffix("_dirty")) == 7


def test_release_summary_holds_only_when_everything_passed_and_was_written(tmp_path, monkeypatch, capsys):
    """--release on the GPU machine (torch's GPU stood in for): release.json and its line; exit
    status 1 where a test failed, was cut short, or a record is missing."""
    import types

    import torch

    props = types.SimpleNamespace(name="NVIDIA H200", multi_processor_count=132, L2_cache_size=60 * 2**20)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setenv("ROPE_COMMIT", "abcdef1")
    folder = tmp_path / "h200"
    folder.mkdir()
    (folder / "bench.json").write_text("{}")
    (tmp_path / "tests.log").write_text("1377 passed, 1 skipped in 200.0s\n")
    (tmp_path / "big.log").write_text("3 passed in 12.0s\n")
    common = ["--release", str(folder), "--seconds", "541", "--tests", str(tmp_path / "tests.log")]
    assert run(tmp_path, *common, "0", "--big", str(tmp_path / "big.log"), "0", "--records", "1") == 0
    line = capsys.readouterr().out.strip()
    assert line == ("release of abcdef1 on NVIDIA H200: tests 1377 passed, 0 failed, 1 skipped; whole_gpu tests "
                    "3 passed, 0 failed, 0 skipped; records 1 of 1 written; 541 s")  # fmt: skip
    summary = json.loads((folder / "release.json").read_text())
    assert summary["commit"] == "abcdef1" and summary["records"] == ["bench"] and summary["gpu"] == "NVIDIA H200"
    assert run(tmp_path, *common, "0", "--big", str(tmp_path / "big.log"), "0", "--records", "2") == 1
    assert run(tmp_path, *common, "1", "--big", str(tmp_path / "big.log"), "0", "--records", "1") == 1
    assert capsys.readouterr().out.strip().endswith("NOT A RELEASE")
