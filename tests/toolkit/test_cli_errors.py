"""The toolkit's commands on bad values: one line on stderr, exit status 2, no traceback,
and nothing written; and without matplotlib, bench writes its results and skips the plot
with a notice."""

import json
import re
import subprocess
import sys

import pytest

from rope_bwd_triton import REPO_ROOT
from rope_bwd_triton import __main__ as toolkit

# (argv after the command's outputs are pointed into tmp_path/out, expected message)
CASES = [
    (["bench", "--calls", "0"], r"bench: error: argument --calls: must be a positive integer, got 0"),
    (["bench", "--seq-lens", "5", "-3"], r"bench: error: argument --seq-lens: must be a positive integer, got -3"),
    (["bench", "--calls", "x"], r"bench: error: argument --calls: expected an integer, got 'x'"),
    (["bench", "--device", "cuda:99"], r"bench: error: argument --device: cuda:99: this machine has"),
    (["bench", "--device", "tpu"], r"bench: error: argument --device: expected cpu or cuda\[:N\], got 'tpu'"),
    (["bench", "--heads", "0"], r"bench: error: argument --heads: must be a positive integer, got 0"),
    (["bench", "--head-dims", "7"], r"bench: error: argument --head-dims: must be even and in 2\.\.256, got 7"),
    (["bench", "--preset", "demo"], r"bench: error: argument --preset: invalid choice: 'demo'"),
    (["bench", "--peers", "eager,foo"], r"bench: error: argument --peers: unknown peers \['foo'\]"),
    (
        ["bench", "--tasks", "bwd,bwd_fp8"],
        r"bench: error: argument --tasks: unknown tasks \['bwd_fp8'\]; choose from bwd,",
    ),
    (["bench", "--from-json", "absent.json"], r"bench: error: argument --from-json: no such file: absent\.json"),
    (
        ["bench", "--peers", "liger,transformers"],
        r"bench: error: --peers: transformers is not a peer of --preset suite",
    ),
    (["bench", "--preset", "realcall", "--peers", "copy,flash"], r"bench: error: argument --peers: unknown peers"),
    (["bench", "--preset", "realcall", "--peers", "eager"], r"bench: error: --peers: eager is not a peer of --pre"),
    (["bench", "--preset", "realcall", "--ab", "absent"], r"bench: error: --ab: no build/ in absent"),
    (
        ["bench", "--preset", "realcall", "--tasks", "bwd"],
        r"bench: error: --tasks is an option of --preset suite and copybound, not of realcall",
    ),
    (
        ["bench", "--dtypes", "float16"],
        r"bench: error: --dtypes is an option of --preset realcall, decoder, decode and families, not of suite",
    ),
    (["bench", "--preset", "copybound", "--quick", "--json"], r"bench: error: argument --json: expected one argument"),
    (["overhead", "--impls", "ours,tvm"], r"overhead: error: argument --impls: unknown implementations \['tvm'\]"),
    (["overhead", "--parts", "host,cold"], r"overhead: error: argument --parts: unknown parts \['cold'\]"),
    (["overhead", "--fast-launch", "on,maybe"], r"overhead: error: argument --fast-launch: unknown settings"),
    (["e2e", "--varres", "--variants", "eager,jax"], r"e2e: error: argument --variants: unknown variants \['jax'\]"),
    (["e2e", "--from-json", "absent.json"], r"e2e: error: argument --from-json: no such file: absent\.json"),
    (["publish", "--dry-run", "--repo-id", "not a repo"], r"publish: error: argument --repo-id: Repo id must use"),
    (
        ["publish", "--dry-run", "--repo-id", "a/b/c"],
        r"publish: error: argument --repo-id: Repo id must be in the form",
    ),
    (["publish", "--dry-run", "--repo-id", "name"], r"publish: error: argument --repo-id: expected <namespace>/<name>"),
    (["publish", "--card-only", "--dry-run"], r"publish: error: argument --dry-run: not allowed with argument --card"),
    (["e2e", "--tokens", "4096", "99"], r"e2e: error: --tokens: 99 tokens is not a square image"),
    (["e2e", "--iters", "7", "--rounds", "5"], r"e2e: error: --iters \(7\) must be a multiple of --rounds \(5\)"),
    (["tune", "--layout", "sdpa"], r"tune: error: --layout sdpa is the upstream gradient's layout: give --modes"),
    (["tune", "--shared"], r"tune: error: --shared writes one winner to the buckets of the S given by --seq-lens"),
    (["tune", "--calls", "0"], r"tune: error: argument --calls: must be a positive integer, got 0"),
    (["tune", "--jobs", "-1"], r"tune: error: argument --jobs: must be 0 or more, got -1"),
    (["tune", "--budget", "-1"], r"tune: error: argument --budget: must be a positive number, got -1"),
]
OUT_FLAGS = {
    "bench": ["--json", "--markdown", "--plot"],
    "e2e": ["--out"],
    "overhead": ["--json"],
    "tune": ["--out", "--log"],
    "publish": ["--to-cache"],
}


def outputs_into(argv, out):
    """argv with every output of the command pointed into `out` (which must stay absent)."""
    flags = OUT_FLAGS[argv[0]]
    if argv[0] == "publish":  # --dry-run and --to-cache exclude each other: these are refused as parsed
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


@pytest.fixture
def no_gpu(monkeypatch):
    """A machine without CUDA, as the commands see it (they ask torch.cuda.is_available() when
    they judge their arguments), and with the interpreter off: these tests run on every machine."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_bench_on_cuda_without_one(no_gpu, capsys, tmp_path):
    out = tmp_path / "out"
    expect_usage_error(
        capsys,
        outputs_into(["bench", "--device", "cuda"], out),
        r"bench: error: argument --device: cuda: this machine has no CUDA GPU",
    )
    assert not out.exists()


def test_tune_without_a_gpu_or_the_interpreter(no_gpu, capsys, tmp_path):
    out = tmp_path / "out"
    expect_usage_error(
        capsys, outputs_into(["tune"], out), r"tune: error: tuning times the Triton kernel: it needs a CUDA GPU"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    "argv,match",
    [
        (["bench", "--preset", "copybound"], r"bench: error: copybound times Triton kernels: it needs a CUDA GPU"),
        (["overhead"], r"overhead: error: overhead times Triton compilations and host time .*: it needs a CUDA GPU"),
    ],
)
def test_gpu_commands_without_one(no_gpu, capsys, tmp_path, argv, match):
    out = tmp_path / "out"
    expect_usage_error(capsys, outputs_into(argv, out), match)
    assert not out.exists()


def test_copybound_quick_without_the_interpreter(no_gpu, capsys, tmp_path):
    out = tmp_path / "out"
    expect_usage_error(
        capsys,
        outputs_into(["bench", "--preset", "copybound", "--quick"], out),
        r"bench: error: --quick runs Triton's copies on the CPU: it needs TRITON_INTERPRET=1",
    )
    assert not out.exists()


def test_the_command_line_itself(tmp_path):
    """As a user runs it: status 2 and one line, no traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "rope_bwd_triton", "bench", "--calls", "0", "--json", str(tmp_path / "o")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr == "python -m rope_bwd_triton bench: error: argument --calls: must be a positive integer, got 0\n"
    )
    assert not (tmp_path / "o").exists()


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError


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
    assert captured.out.splitlines()[-1] == f"wrote {files['json']}, {files['markdown']}"
