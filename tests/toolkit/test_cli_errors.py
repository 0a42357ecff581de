"""The toolkit's commands on bad values: one line on stderr, exit status 2, no traceback,
and nothing written; and without matplotlib, demo and bench write their results and
skip the plot with a notice."""

import json
import re
import subprocess
import sys

import pytest

from rope_bwd_triton import REPO_ROOT
from rope_bwd_triton import __main__ as toolkit

from ..helpers import HAS_CUDA, INTERPRET

# (argv after the command's outputs are pointed into tmp_path/out, expected message)
CASES = [
    (["demo", "--calls", "0"], r"demo: error: argument --calls: must be a positive integer, got 0"),
    (["demo", "--seq-lens", "5", "-3"], r"demo: error: argument --seq-lens: must be a positive integer, got -3"),
    (["demo", "--calls", "x"], r"demo: error: argument --calls: expected an integer, got 'x'"),
    (["bench", "--device", "cuda:99"], r"bench: error: argument --device: cuda:99: this machine has"),
    (["bench", "--device", "tpu"], r"bench: error: argument --device: expected cpu or cuda\[:N\], got 'tpu'"),
    (["bench", "--seq-lens", "0"], r"bench: error: argument --seq-lens: must be a positive integer, got 0"),
    (["bench", "--heads", "0"], r"bench: error: argument --heads: must be a positive integer, got 0"),
    (["bench", "--head-dim", "7"], r"bench: error: argument --head-dim: must be even and in 2\.\.256, got 7"),
    (["bench", "--calls", "-1"], r"bench: error: argument --calls: must be a positive integer, got -1"),
    (["bench", "--peers", "eager,foo"], r"bench: error: argument --peers: unknown peers \['foo'\]"),
    (
        ["bench", "--tasks", "bwd,bwd_fp8"],
        r"bench: error: argument --tasks: unknown tasks \['bwd_fp8'\]; choose from bwd,",
    ),
    (["bench", "--from-json", "absent.json"], r"bench: error: argument --from-json: no such file: absent\.json"),
    (["realcall", "--peers", "copy,flash"], r"realcall: error: argument --peers: unknown peers \['flash'\]"),
    (["realcall", "--ab", "absent"], r"realcall: error: --ab: no build/ in absent"),
    (["coldstart", "--impls", "ours,tvm"], r"coldstart: error: argument --impls: unknown implementations \['tvm'\]"),
    (["e2e", "--varres", "--variants", "eager,jax"], r"e2e: error: argument --variants: unknown variants \['jax'\]"),
    (["e2e", "--from-json", "absent.json"], r"e2e: error: argument --from-json: no such file: absent\.json"),
    (["publish", "--dry-run", "--repo-id", "not a repo"], r"publish: error: argument --repo-id: Repo id must use"),
    (
        ["publish", "--dry-run", "--repo-id", "a/b/c"],
        r"publish: error: argument --repo-id: Repo id must be in the form",
    ),
    (["publish", "--dry-run", "--repo-id", "name"], r"publish: error: argument --repo-id: expected <namespace>/<name>"),
    (["e2e", "--tokens", "4096", "99"], r"e2e: error: --tokens: 99 tokens is not a square image"),
    (["e2e", "--iters", "7", "--rounds", "5"], r"e2e: error: --iters \(7\) must be a multiple of --rounds \(5\)"),
    (["tune", "--layout", "sdpa"], r"tune: error: --layout sdpa is the upstream gradient's layout: give --modes"),
    (["tune", "--shared"], r"tune: error: --shared writes one winner to the buckets of the S given by --seq-lens"),
    (["tune", "--calls", "0"], r"tune: error: argument --calls: must be a positive integer, got 0"),
    (["tune", "--jobs", "-1"], r"tune: error: argument --jobs: must be 0 or more, got -1"),
    (["tune", "--budget", "-1"], r"tune: error: argument --budget: must be a positive number, got -1"),
    (["ncu"], r"ncu: error: the following arguments are required: \{metrics,run,report\}"),
    (["ncu", "profile"], r"ncu: error: argument \{metrics,run,report\}: invalid choice: 'profile'"),
    (
        ["ncu", "report", "absent.csv", "--labels", "absent.json"],
        r"ncu report: error: argument csv: no such file: absent\.csv",
    ),
    (["ncu", "run"], r"ncu run: error: the following arguments are required: --labels"),
    (["copybound", "--quick", "--json"], r"copybound: error: argument --json: expected one argument"),
    (["crosstriton", "run", "absent"], r"crosstriton: error: folder: no meta\.json in absent"),
    (["crosstriton", "run", "x", "--calls", "0"], r"crosstriton run: error: argument --calls: must be a positive"),
    (["crosstriton", "compile"], r"crosstriton compile: error: the following arguments are required: --out"),
    (["crosstriton", "compile", "--out"], r"crosstriton compile: error: argument --out: expected one argument"),
]
OUT_FLAGS = {
    "demo": ["--out"],
    "bench": ["--json", "--markdown", "--plot"],
    "e2e": ["--out"],
    "realcall": ["--json", "--markdown", "--plot"],
    "coldstart": ["--json"],
    "host": [],
    "tune": ["--out", "--log"],
    "publish": ["--to-cache"],
    "copybound": ["--json"],
    "ncu": [],
    "ncu report": ["--markdown"],
    "crosstriton": [],
    "crosstriton run": ["--json"],
}


def outputs_into(argv, out):
    """argv with every output of the command pointed into `out` (which must stay absent)."""
    flags = OUT_FLAGS.get(" ".join(argv[:2]), OUT_FLAGS[argv[0]])
    if argv[0] == "publish":  # --dry-run and --to-cache exclude each other: the dry run writes nothing
        return argv
    return argv + [x for i, f in enumerate(flags) for x in (f, str(out / f"{i}-{f.strip('-')}"))]


def expect_usage_error(capsys, argv, match):
    with pytest.raises(SystemExit) as e:
        toolkit.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("python -m rope_bwd_triton ")
    assert re.search(match, lines[0]), lines[0]


@pytest.mark.parametrize("argv,match", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_values(capsys, tmp_path, argv, match):
    out = tmp_path / "out"
    expect_usage_error(capsys, outputs_into(argv, out), match)
    assert not out.exists(), "a refused command wrote"


@pytest.mark.parametrize(
    "meta,argv,match",
    [
        (
            {"triton": "3.9.0", "gpu": "NVIDIA H200", "cases": []},
            [],
            r"crosstriton: error: folder: \S*cubins was compiled by an older crosstriton: compile it again",
        ),
        (
            {"triton": "3.9.0", "gpu": "NVIDIA H200", "sms": 132, "later_triton": True, "cases": []},
            ["--configs-out", "t.json"],
            r"crosstriton: error: --configs-out: \S*cubins holds cases, not the candidates of `compile --tune`",
        ),
    ],
    ids=["stale", "configs-out"],
)
def test_crosstriton_run_refuses_a_folder_it_cannot_use(capsys, tmp_path, meta, argv, match):
    folder, out = tmp_path / "cubins", tmp_path / "out"
    folder.mkdir()
    (folder / "meta.json").write_text(json.dumps(meta))
    argv = ["crosstriton", "run", str(folder), *(a if a != "t.json" else str(out / a) for a in argv)]
    expect_usage_error(capsys, outputs_into(argv, out), match)
    assert not out.exists()


@pytest.mark.skipif(HAS_CUDA, reason="the machine has a CUDA GPU")
def test_bench_on_cuda_without_one(capsys, tmp_path):
    out = tmp_path / "out"
    expect_usage_error(
        capsys,
        outputs_into(["bench", "--device", "cuda"], out),
        r"bench: error: argument --device: cuda: this machine has no CUDA GPU",
    )
    assert not out.exists()


@pytest.mark.skipif(HAS_CUDA or INTERPRET, reason="tune runs here")
def test_tune_without_a_gpu_or_the_interpreter(capsys, tmp_path):
    out = tmp_path / "out"
    expect_usage_error(
        capsys, outputs_into(["tune"], out), r"tune: error: tuning times the Triton kernel: it needs a CUDA GPU"
    )
    assert not out.exists()


@pytest.mark.skipif(HAS_CUDA, reason="the machine has a CUDA GPU")
@pytest.mark.parametrize(
    "argv,match",
    [
        (["copybound"], r"copybound: error: copybound times Triton kernels: it needs a CUDA GPU"),
        (["ncu", "run", "--labels"], r"ncu: error: ncu run launches our kernel on a CUDA GPU"),
        (["host"], r"host: error: host times the launch path on a CUDA GPU"),
    ],
)
def test_gpu_commands_without_one(capsys, tmp_path, argv, match):
    out = tmp_path / "out"
    argv = argv + [str(out / "labels.json")] if argv[-1] == "--labels" else outputs_into(argv, out)
    expect_usage_error(capsys, argv, match)
    assert not out.exists()


@pytest.mark.skipif(INTERPRET, reason="the interpreter is on")
def test_copybound_quick_without_the_interpreter(capsys, tmp_path):
    out = tmp_path / "out"
    expect_usage_error(
        capsys,
        outputs_into(["copybound", "--quick"], out),
        r"copybound: error: --quick runs Triton's copies on the CPU: it needs TRITON_INTERPRET=1",
    )
    assert not out.exists()


def test_the_command_line_itself(tmp_path):
    """As a user runs it: status 2 and one line, no traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "rope_bwd_triton", "demo", "--calls", "0", "--out", str(tmp_path / "o")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "python -m rope_bwd_triton demo: error: argument --calls: must be a positive integer, got 0\n"
    assert not (tmp_path / "o").exists()


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError


def test_demo_without_matplotlib(kernel, no_matplotlib, capsys, tmp_path):
    assert toolkit.main(["demo", "--seq-lens", "3", "--calls", "2", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert json.loads((tmp_path / "demo.json").read_text())["workloads"][0]["results"]["ours_bwd"]["verify"]["ok"]
    assert not (tmp_path / "demo.png").exists()
    assert f"demo: matplotlib is not installed, so {tmp_path / 'demo.png'} is not drawn" in captured.err
    assert captured.out.splitlines()[-1] == f"wrote {tmp_path / 'demo.json'}"


def test_bench_without_matplotlib(kernel, no_matplotlib, capsys, tmp_path):
    files = {f: tmp_path / f"bench.{ext}" for f, ext in (("json", "json"), ("markdown", "md"), ("plot", "png"))}
    argv = ["bench", "--quick", "--device", "cpu", "--peers", "eager", "--seq-lens", "8"]
    assert toolkit.main(argv + [x for f, p in files.items() for x in (f"--{f}", str(p))]) == 0
    captured = capsys.readouterr()
    assert json.loads(files["json"].read_text())["workloads"][0]["S"] == 8
    md = files["markdown"].read_text()
    assert "Verification" in md and "bench.png" not in md  # no link to a plot that is not there
    assert not files["plot"].exists()
    assert f"bench: matplotlib is not installed, so {files['plot']} is not drawn" in captured.err
    assert captured.out.splitlines()[-1] == f"wrote {files['markdown']}"
