"""Publishing in the layout of kernel-builder's upload: the card (README.md's card part under
the front matter `library_name: kernels`) as README.md on main; the build variants and
benchmarks/benchmark*.py on v1. The dry run writes the card and prints exactly those
operations, the offline twin holds exactly those files per branch, and it serves the exact
user calls in a fresh process with HF_HUB_OFFLINE=1 and the network refused:
kernels.get_kernel(<repo-id>, version=1, trust_remote_code=True) and kernelize
through the package's mapping."""

import os
import subprocess
import sys
import textwrap

import pytest
from huggingface_hub import metadata_load

from rope_bwd_triton import REPO_ROOT, cli, publish
from rope_bwd_triton import __main__ as toolkit
from rope_bwd_triton.build import repo_id

VARIANT_FILES = {
    "__init__.py",
    "_ops.py",
    "metadata.json",
    "ops.py",
    "layers.py",
    "integrations.py",
    "symbols.json",
}

USER_CALLS = textwrap.dedent("""
    import sys
    import kernels
    import torch
    from tests import offline, reference
    offline.install()

    rope = kernels.get_kernel({repo!r}, version=1, trust_remote_code=True)
    print("loaded from", rope.__file__)
    inputs = reference.make_inputs(131, 4, 72, generator=torch.Generator().manual_seed(0))
    for got, ref in zip(rope.rope_bwd(**inputs), reference.reference_backward(**inputs)):
        assert reference.rel_err(got, ref) < 1e-5, reference.rel_err(got, ref)
    print("rope_bwd matches float64")

    @kernels.use_kernel_forward_from_hub("ApplyRotaryPosEmbVision")
    class Rotary(torch.nn.Module):
        def forward(self, q, k, cos, sin):
            raise AssertionError("not kernelized")

    mapping = rope.kernel_mapping()
    print("mapping:", type(mapping["ApplyRotaryPosEmbVision"]["cpu"][kernels.Mode.TRAINING]).__name__)
    with kernels.use_kernel_mapping(mapping):
        model = kernels.kernelize(Rotary(), mode=kernels.Mode.TRAINING, device="cpu", use_fallback=False)
    q, k, _, _, e = inputs.values()
    for got, ref in zip(model(q, k, e.cos(), e.sin()), reference.reference_forward(q, k, e)):
        assert reference.rel_err(got, ref) < 1e-5, reference.rel_err(got, ref)
    print("kernelized layer matches float64")
    try:
        kernels.get_kernel({repo!r}, version=2, trust_remote_code=True)
    except ValueError as e:
        print("version 2:", e)
    else:
        sys.exit("version 2 loaded")
    assert not offline.attempts, offline.attempts
""")


def _expected_layout(build):
    """{branch: paths in repo}, from what lies in benchmarks/ and the build folder's variants
    (torch-*; other tests build beside them, e.g. hub_twins/)."""
    benchmarks = [f"benchmarks/{p.name}" for p in (REPO_ROOT / "benchmarks").glob("benchmark*.py")]
    build = [
        f"build/{p.relative_to(build).as_posix()}"
        for p in build.glob("torch-*/**/*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    return {"main": ["README.md"], "v1": sorted(benchmarks + build)}


def test_operations_are_kernel_builders_layout():
    ops = publish.operations()
    assert list(ops) == ["main", "v1"]
    assert ops["main"] == [(REPO_ROOT / "CARD.md", "README.md")]
    dests = [rel for _, rel in ops["v1"]]
    assert dests == _expected_layout(REPO_ROOT / "build")["v1"]
    assert "benchmarks/benchmark.py" in dests and not any(
        d.startswith("benchmarks/") and "benchmark" not in d for d in dests
    )
    for variant in ("torch-cpu", "torch-cuda"):
        assert {f"build/{variant}/{name}" for name in VARIANT_FILES} <= set(dests)
    assert not any("__pycache__" in d or d.endswith(".pyc") for d in dests)
    assert publish.stale_patterns(ops["v1"]) == [
        "build/torch-cpu/**",
        "build/torch-cuda/**",
        "benchmarks/benchmark*.py",
    ]


def test_card_is_readmes_card_part():
    readme = (REPO_ROOT / "README.md").read_text()
    assert (REPO_ROOT / "CARD.md").read_text() == publish.render_card(readme)
    body = readme.split(publish.START)[1].split(publish.END)[0]
    assert 'get_kernel("rope-bwd/rope-bwd", version=1' in body and "## Performance" in body
    assert "](" not in body.replace("](https://", ""), "a relative link would break on the Hub page"


def test_card_needs_the_markers():
    with pytest.raises(cli.UsageError, match="card:start"):
        publish.render_card("# no card part\n")


def test_card_is_a_kernels_card():
    """The Hub lists the repository under the kernels library; kernel-builder's fill-card renders
    CARD.md as a template, which leaves a card without template syntax as it is."""
    assert metadata_load(REPO_ROOT / "CARD.md")["library_name"] == "kernels"
    text = (REPO_ROOT / "CARD.md").read_text()
    assert not any(token in text for token in ("{{", "{%", "{#"))


@pytest.fixture
def card(monkeypatch, tmp_path):
    """Where publish writes the card in these tests: not over the checkout's CARD.md, which
    test_card_is_readmes_card_part judges."""
    monkeypatch.setattr(publish, "CARD", tmp_path / "CARD.md")
    return publish.CARD


def test_card_only_writes_the_card_and_check_card_judges_it(capsys, card):
    card.write_text("stale\n")
    assert toolkit.main(["publish", "--check-card"]) == 1
    assert "is out of date" in capsys.readouterr().err and card.read_text() == "stale\n"
    assert toolkit.main(["publish", "--card-only"]) == 0
    assert capsys.readouterr().out == f"wrote {card}\n"
    assert card.read_text() == publish.render_card((REPO_ROOT / "README.md").read_text())
    assert toolkit.main(["publish", "--check-card"]) == 0


def test_dry_run_writes_the_card_and_prints_exactly_the_operations(capsys, monkeypatch, card):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", None)  # a dry run must not talk to the Hub
    assert toolkit.main(["publish", "--dry-run", "--repo-id", "org/name"]) == 0
    lines = capsys.readouterr().out.splitlines()
    ops = publish.operations()
    assert card.read_text() == publish.render_card((REPO_ROOT / "README.md").read_text())
    assert lines == [
        f"wrote {card}",
        "would upload to kernel repository org/name (kernel-builder's upload layout):",
        "branch main:",
        f"  add {card} -> README.md",
        "branch v1:",
        *(f"  add {src.relative_to(REPO_ROOT)} -> {rel}" for src, rel in ops["v1"]),
        "  delete files matching build/torch-cpu/**, build/torch-cuda/**, benchmarks/benchmark*.py"
        " that are not added above",
    ]


def test_offline_cache_mirrors_the_upload_and_serves_the_user_calls(tmp_path):
    snapshots = publish.install_build(tmp_path)
    storage = tmp_path / "kernels--{}--{}".format(*repo_id().split("/"))
    ops = publish.operations()
    for ref, snapshot in snapshots.items():
        assert snapshot.parent.parent == storage and (storage / "refs" / ref).read_text() == snapshot.name
        assert snapshot.name == publish.commit_id(ops[ref]) and len(snapshot.name) == 40  # deterministic
        held = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
        assert held == _expected_layout(REPO_ROOT / "build")[ref], ref
        for src, rel in ops[ref]:
            assert (snapshot / rel).read_bytes() == src.read_bytes()
    assert (snapshots["main"] / "README.md").read_text() == (REPO_ROOT / "CARD.md").read_text()

    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_KERNELS", "TRITON_INTERPRET")}
    # Keep the caller's PYTHONPATH: on the GPU machine kernels itself is installed through it.
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    env.update(
        HF_HUB_OFFLINE="1", KERNELS_CACHE=str(tmp_path), HF_HUB_CACHE=str(tmp_path / "hub"), PYTHONPATH=pythonpath
    )
    proc = subprocess.run(
        [sys.executable, "-c", USER_CALLS.format(repo=repo_id())],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"loaded from {snapshots['v1']}/build/torch-" in proc.stdout
    assert "rope_bwd matches float64" in proc.stdout
    assert "mapping: LayerRepository" in proc.stdout and "kernelized layer matches float64" in proc.stdout
    assert "version 2: Version 2 not found, available versions: 1" in proc.stdout
