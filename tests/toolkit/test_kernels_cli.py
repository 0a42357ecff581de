"""The kernels CLI (kernels 0.19.1, its `kernels` console script) on our build, offline.
`kernels info <checkout>` and `kernels describe-api` (on the checkout, on a built variant and
on the offline twin of the Hub upload) run offline and pass; the others need the Hub, and each
fails offline for the reason docs/hub.md gives, so a kernels release that changes that shows
up here. Each runs in a fresh process with HF_HUB_OFFLINE=1, KERNELS_CACHE at the offline twin
of the upload, and the network refused."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from rope_bwd_triton import REPO_ROOT, api, publish
from rope_bwd_triton.build import read_config, repo_id

# The `kernels` command as pip installs it: the console script's entry point.
SIGSTORE = importlib.util.find_spec("sigstore") is not None  # kernels' [sigstore] extra
CLI = (
    "import sys; from importlib.metadata import entry_points; from tests import offline; offline.install(); "
    "main = entry_points(group='console_scripts')['kernels'].load(); sys.argv[0] = 'kernels'; sys.exit(main())"
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


@pytest.mark.parametrize("where", ["checkout", "variant", "hub cache"])
def test_describe_api_lists_the_packages_functions_and_layers(kernel, hub_cache, tmp_path, where):
    """`kernels describe-api` reads symbols.json without importing the kernel: the loaded
    package's functions and layers, with the layers' flags, wherever the variant is."""
    variant = "torch-cuda" if "cuda" in kernel.__name__ else "torch-cpu"
    target, extra = {
        "checkout": (str(REPO_ROOT), {"path": str(REPO_ROOT), "variant": variant}),
        "variant": (str(REPO_ROOT / "build" / "torch-cuda"), {"variant": "torch-cuda"}),
        "hub cache": (repo_id(), {"repo_id": repo_id(), "revision": "v1", "variant": variant}),
    }[where]
    options = ["--version", "1"] if where == "hub cache" else []
    proc = kernels_cli("describe-api", target, *options, "--json", cache=hub_cache, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    described = json.loads(proc.stdout)
    assert {k: described[k] for k in ("schema_version", "functions", "layers")} == api.symbols(api.describe(kernel))
    assert {k: described[k] for k in extra} == extra
    assert {"rope_bwd", "rope_fwd", "apply_rotary_pos_emb_vision"} <= {f["name"] for f in described["functions"]}


def test_describe_api_says_what_is_missing(hub_cache, tmp_path):
    """A variant without symbols.json (a build by an older builder) is named, not a traceback."""
    variant = tmp_path / "torch-cpu"
    variant.mkdir()
    (variant / "metadata.json").write_bytes((REPO_ROOT / "build" / "torch-cpu" / "metadata.json").read_bytes())
    proc = kernels_cli("describe-api", str(variant), cache=hub_cache, cwd=tmp_path)
    assert proc.returncode == 1 and "No symbols.json found" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "command,reason",
    [
        # moved out of the kernels CLI; kernel-builder's build runs its checks in hub CI
        (["check"], "`kernels check` has moved to `kernel-builder check-abi`"),
        # list the version branch's build/ through the Hub API (`versions` is deprecated for it)
        (["versions", "{repo}"], "OfflineModeIsEnabled"),
        (["variants", "{repo}"], "OfflineModeIsEnabled"),
        # ask the Hub whether the publisher is trusted before anything else (with kernels' sigstore
        # extra, which requirements-dev installs; without it, say that it is missing)
        (["verify-signature", "{repo}", "1"], "could not verify publisher trust status" if SIGSTORE else "`sigstore`"),
        (["lock", "{project}"], "could not verify publisher trust status"),
    ],
    ids=["check", "versions", "variants", "verify-signature", "lock"],
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
