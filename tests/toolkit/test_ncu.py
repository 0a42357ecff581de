"""`python -m rope_bwd_triton ncu report`: Nsight Compute's raw CSV (log lines, header, units, one
row per kernel in launch order) joined with the labels its `run` step wrote. The run step itself
needs ncu and a GPU (`bash scripts/h200.sh ncu`)."""

import csv
import io
import json
import random

import pytest

from rope_bwd_triton import __main__ as toolkit
from rope_bwd_triton import ncu


def _ncu_csv(values):
    """A raw-page CSV as ncu writes it: its log lines first, then the metrics in any order among
    other columns, thousands separators included."""
    metrics = [m for m, _, _ in ncu.COLUMNS.values()]
    header = ["ID", "Kernel Name", "other.metric"] + metrics[::-1]
    buf = io.StringIO()
    buf.write("==PROF== Connected to process 1\n")
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    w.writerow(header)
    w.writerow(["", "", "unit"] + ["unit"] * len(metrics))
    for i, row in enumerate(values):
        w.writerow([str(i), "rotary_kernel", "7"] + [f"{row[m]:,}" for m in metrics[::-1]])
    buf.write("==PROF== Disconnected from process 1\n")
    return buf.getvalue()


def test_report_joins_labels_and_scales_each_metric(tmp_path, capsys):
    rnd = random.Random()
    metrics = [m for m, _, _ in ncu.COLUMNS.values()]
    values = [{m: rnd.randint(1000, 10**9) for m in metrics} for _ in range(2)]
    (tmp_path / "ncu.csv").write_text(_ncu_csv(values))
    labels = {
        "meta": {"gpu": "GPU X", "versions": {"torch": "2.x"}, "kernel_variant": "v"},
        "kernels": [["bwd S=128 D=128", "ours"], ["bwd S=128 D=128", "torch.neg, same bytes"]],
    }
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    md = tmp_path / "ncu.md"
    assert (
        toolkit.main(
            [
                "ncu",
                "report",
                str(tmp_path / "ncu.csv"),
                "--labels",
                str(tmp_path / "labels.json"),
                "--markdown",
                str(md),
            ]
        )
        == 0
    )
    lines = md.read_text().splitlines()
    assert lines[0] == "Device: GPU X; torch 2.x; kernel variant `v`"
    rows = [line for line in lines if line.startswith("| bwd")]
    assert len(rows) == 2
    for row, (_, what), vals in zip(rows, labels["kernels"], values):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[:2] == ["bwd S=128 D=128", what]
        for cell, (metric, scale, fmt) in zip(cells[2:], ncu.COLUMNS.values()):
            assert cell == fmt.format(vals[metric] * scale)
    assert capsys.readouterr().out.startswith("Device: GPU X")


def test_report_refuses_a_csv_whose_kernels_do_not_match_the_labels(tmp_path, capsys):
    metrics = [m for m, _, _ in ncu.COLUMNS.values()]
    (tmp_path / "ncu.csv").write_text(_ncu_csv([{m: 1 for m in metrics}] * 3))
    (tmp_path / "labels.json").write_text(json.dumps({"meta": {}, "kernels": [["a", "ours"], ["a", "neg"]]}))
    with pytest.raises(SystemExit) as e:
        toolkit.main(["ncu", "report", str(tmp_path / "ncu.csv"), "--labels", str(tmp_path / "labels.json")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("python -m rope_bwd_triton ncu: error: ") and "3 profiled kernels for 2 labels" in err
