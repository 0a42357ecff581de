"""Publishing: the dry run lists exactly what goes where, and the offline twin (the same
files in a Hub-cache layout) serves the exact user call, kernels.get_kernel(<repo-id>,
version=1, trust_remote_code=True), in a fresh process with HF_HUB_OFFLINE=1."""

import os
import subprocess
import sys
import textwrap
from argparse import Namespace

import pytest

from rope_bwd_triton import REPO_ROOT, publish
from rope_bwd_triton.build import repo_id

USER_CALL = textwrap.dedent("""
    import sys
    import kernels
    import torch
    from rope_bwd_triton import suite

    rope = kernels.get_kernel({repo!r}, version=1, trust_remote_code=True)
    print("loaded from", rope.__file__)
    inputs = suite.make_inputs(131, 4, 72, generator=torch.Generator().manual_seed(0))
    for got, ref in zip(rope.rope_bwd(**inputs), suite.reference_backward(**inputs)):
        assert suite.rel_err(got, ref) < 1e-5, suite.rel_err(got, ref)
    print("rope_bwd matches float64")
    try:
        kernels.get_kernel({repo!r}, version=2, trust_remote_code=True)
    except ValueError as e:
        print("version 2:", e)
    else:
        sys.exit("version 2 loaded")
""")


def test_dry_run_lists_every_file_and_destination(capsys, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", None)  # a dry run must not talk to the Hub
    assert publish.main(Namespace(repo_id="org/name", dry_run=True, to_cache=None)) == 0
    lines = capsys.readouterr().out.splitlines()
    files = publish.publish_files()
    assert lines[0] == f"would upload {len(files)} files to kernel repository org/name, branch v1:"
    expected = [f"  {src.relative_to(REPO_ROOT)} -> org/name@v1:{dest}" for src, dest in files]
    assert lines[1:] == expected
    dests = {dest for _, dest in files}
    assert "README.md" in dests
    for variant in ("torch-cpu", "torch-cuda"):
        for name in ("__init__.py", "_ops.py", "metadata.json", "ops.py", "layers.py", "integrations.py",
                     "rope_bwd/__init__.py"):
            assert f"build/{variant}/{name}" in dests
    assert not any("__pycache__" in d or d.endswith(".pyc") for d in dests)


def test_offline_cache_serves_the_user_call(tmp_path):
    snapshot = publish.install_build(tmp_path)
    commit = snapshot.name
    storage = tmp_path / "kernels--{}--{}".format(*repo_id().split("/"))
    assert snapshot.parent.parent == storage and (storage / "refs" / "v1").read_text() == commit
    assert len(commit) == 40 and publish.commit_id(publish.publish_files()) == commit  # deterministic
    assert (snapshot / "README.md").read_text() == (REPO_ROOT / "CARD.md").read_text()

    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_KERNELS", "TRITON_INTERPRET")}
    # Keep the caller's PYTHONPATH: on the GPU machine kernels itself is installed through it.
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    env.update(HF_HUB_OFFLINE="1", KERNELS_CACHE=str(tmp_path), HF_HUB_CACHE=str(tmp_path / "hub"),
               PYTHONPATH=pythonpath)
    proc = subprocess.run([sys.executable, "-c", USER_CALL.format(repo=repo_id())], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"loaded from {snapshot}/build/torch-" in proc.stdout
    assert "rope_bwd matches float64" in proc.stdout
    assert "version 2: Version 2 not found, available versions: 1" in proc.stdout
