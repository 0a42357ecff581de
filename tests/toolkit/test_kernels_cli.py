"""The kernels CLI (kernels 0.17.2) on our build, offline. `kernels info <checkout>` is the
check that runs offline, and it passes; the others need the Hub, and each fails offline
for the reason README.md gives (section "Hub CI and publishing"), so a kernels release
that changes that shows up here. Each runs in a fresh process with HF_HUB_OFFLINE=1,
KERNELS_CACHE at the offline twin of the upload, and the network refused."""

import json
import os
import subprocess
import sys

import pytest

from rope_bwd_triton import REPO_ROOT, publish
from rope_bwd_triton.build import read_config, repo_id

# The CLI imports sigstore (signature checks): a machine without it cannot run these.
pytest.importorskip("kernels.cli", reason="kernels' CLI needs its optional dependencies (sigstore)")

CLI = (
    "import sys; from tests import offline; offline.install(); "
    "from kernels.cli import main; sys.argv[0] = 'kernels'; sys.exit(main())"
)


@pytest.fixture(scope="module")
def hub_cache(kernel, tmp_path_factory):
    cache = tmp_path_factory.mktemp("kernels-cache")
    publish.install_build(cache)
    return cache


def kernels_cli(*args, cache, cwd):
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_KERNELS"}
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    env.update(HF_HUB_OFFLINE="1", KERNELS_CACHE=str(cache), HF_HUB_CACHE=str(cache / "hub"), PYTHONPATH=pythonpath)
    return subprocess.run(
        [sys.executable, "-c", CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_info_describes_the_build(hub_cache, tmp_path):
    """`kernels info <checkout>`: kernels' own reading of build/ (variants and metadata)."""
    proc = kernels_cli("info", str(REPO_ROOT), "--json", cache=hub_cache, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    general = read_config()["general"]
    info = json.loads(proc.stdout)
    assert (info["name"], info["version"], info["license"], info["python_depends"]) == (
        general["name"],
        general["version"],
        general["license"],
        [],
    )
    assert info["backends"] == sorted(general["backends"])


@pytest.mark.parametrize(
    "command,reason",
    [
        # moved out of the kernels CLI; kernel-builder's build runs its checks in hub CI
        (["check"], "`kernels check` has moved to `kernel-builder check-abi`"),
        # lists the version branch's build/ through the Hub API
        (["versions", "{repo}"], "OfflineModeIsEnabled"),
        # asks the Hub whether the publisher is trusted before anything else
        (["verify-signature", "{repo}", "1"], "could not verify publisher trust status"),
        (["lock", "{project}"], "could not verify publisher trust status"),
    ],
    ids=["check", "versions", "verify-signature", "lock"],
)
def test_hub_commands_say_why_they_do_not_run_offline(hub_cache, tmp_path, command, reason):
    project = tmp_path / "project"  # a project that depends on the kernel, for `kernels lock`
    project.mkdir()
    (project / "pyproject.toml").write_text(
        f'[project]\nname = "user"\nversion = "0"\n\n[tool.kernels.dependencies]\n"{repo_id()}" = 1\n'
    )
    args = [a.format(repo=repo_id(), project=project) for a in command]
    proc = kernels_cli(*args, cache=hub_cache, cwd=tmp_path)
    assert proc.returncode != 0 and reason in proc.stderr, proc.stderr[-2000:]
    assert "tests run offline" not in proc.stderr  # HF_HUB_OFFLINE, not our refusal, stopped it
    assert not (project / "kernels.lock").exists()
