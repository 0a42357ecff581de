"""Hub CI and releases as kernels-community packages run them: flake.nix and flake.lock
(kernel-builder pinned), and the GitHub workflows, which only GitHub runs: parsed with
PyYAML here (scripts/lint-workflows.sh checks them against the workflow schema and
with zizmor)."""

import json
import os
import re
import subprocess

import pytest
import yaml

from rope_bwd_triton import REPO_ROOT

# kernel-builder's revision that kernels-community/relu and kernels-community/activation pin:
# its ci-test installs kernels and sets LOCAL_KERNELS, which tests/conftest.py relies on.
KERNEL_BUILDER = "18c4d686a271ca6e56d0110fd36a9a5f58e86215"
# The package outputs genKernelFlakeOutputs defines at that revision (nix-builder/lib/gen-flake-outputs.nix).
FLAKE_OUTPUTS = {
    "archVariants",
    "backendBundle",
    "backendCi",
    "build-and-copy",
    "build-and-upload",
    "bundle",
    "ci",
    "ci-test",
    "ciTests",
    "default",
    "kernels",
    "pkgs",
    "redistributable",
    "variants",
}
WORKFLOWS = REPO_ROOT / ".github" / "workflows"


def workflow(name):
    wf = yaml.safe_load((WORKFLOWS / name).read_text())
    wf["on"] = wf.pop(True, wf.get("on"))  # YAML 1.1 reads the key `on` as true
    return wf


def steps(wf):
    return [step for job in wf["jobs"].values() for step in job["steps"]]


def runs(wf):
    return "\n".join(step.get("run", "") for step in steps(wf))


def test_flake_lock_pins_kernel_builder():
    lock = json.loads((REPO_ROOT / "flake.lock").read_text())
    nodes = lock["nodes"]
    assert nodes[lock["root"]]["inputs"] == {"kernel-builder": "kernel-builder"}
    kb = nodes["kernel-builder"]
    assert kb["original"] == {"owner": "huggingface", "repo": "kernels", "type": "github"}
    assert (kb["locked"]["type"], kb["locked"]["owner"], kb["locked"]["repo"], kb["locked"]["rev"]) == (
        "github",
        "huggingface",
        "kernels",
        KERNEL_BUILDER,
    )
    for name, node in nodes.items():  # every input locked to a commit and a content hash
        if name != lock["root"]:
            assert re.fullmatch(r"[0-9a-f]{40}", node["locked"]["rev"]), name
            assert node["locked"]["narHash"].startswith("sha256-"), name
    for name, node in nodes.items():  # every input, and every `follows` path, names a node
        for target in node.get("inputs", {}).values():
            if isinstance(target, list):
                at = lock["root"]
                for hop in target:
                    at = nodes[at]["inputs"][hop]
                target = at
            assert target in nodes, (name, target)


def test_flake_generates_kernel_builders_outputs():
    flake = (REPO_ROOT / "flake.nix").read_text()
    assert re.search(r'kernel-builder\.url\s*=\s*"github:huggingface/kernels"\s*;', flake)
    assert re.search(r"kernel-builder\.lib\.genKernelFlakeOutputs\s*\{\s*inherit self;\s*path = \./\.;\s*\}", flake)


def test_workflows_use_outputs_kernel_builder_defines():
    for path in sorted(WORKFLOWS.glob("*.yaml")):
        targets = re.findall(r"\.#([\w-]+)", runs(workflow(path.name)))
        assert set(targets) <= FLAKE_OUTPUTS, (path.name, targets)
        assert targets or path.name == "api.yaml", path.name  # the API check is the toolkit's


def test_actions_are_pinned_to_commits():
    for path in sorted(WORKFLOWS.glob("*.yaml")):
        for step in steps(workflow(path.name)):
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), (path.name, step["uses"])


def test_pull_requests_build_every_backend_and_run_the_kernels_ci_tests():
    wf = workflow("build.yaml")
    assert "pull_request" in wf["on"]
    jobs = wf["jobs"]
    assert "nix eval .#backendCi --apply builtins.attrNames --json" in runs({"jobs": {"b": jobs["backends"]}})
    assert jobs["build"]["strategy"]["matrix"]["backend"] == "${{ fromJSON(needs.backends.outputs.backends) }}"
    build = [s for s in jobs["build"]["steps"] if "run" in s]
    assert [(s["run"], s["env"]) for s in build] == [
        ('nix build -L ".#backendCi.$BACKEND"', {"BACKEND": "${{ matrix.backend }}"})
    ]
    assert [s["run"] for s in jobs["test"]["steps"] if "run" in s] == ["nix run -L .#ci-test"]


def test_a_gpu_runner_runs_the_kernels_ci_tests_and_refuses_to_skip_them():
    """As kernels-community's ci-test on their GPU runner group; tests/skips.py fails the run
    where torch sees no GPU there."""
    job = workflow("build.yaml")["jobs"]["gpu-test"]
    assert job["runs-on"] == {"group": "aws-g6-12xlarge-plus"}
    scripts = [s for s in job["steps"] if "run" in s]
    assert "/run/opengl-driver/lib" in scripts[0]["run"] and "nvidia-smi" in scripts[0]["run"]
    assert [(s["run"], s.get("env")) for s in scripts[1:]] == [("nix run -L .#ci-test", {"ROPE_EXPECT_CUDA": "1"})]


def test_pull_requests_check_the_public_api():
    wf = workflow("api.yaml")
    assert "pull_request" in wf["on"]
    assert runs(wf).strip().endswith(".venv/bin/python -m rope_bwd_triton api --check")


def test_a_release_tag_builds_signs_then_uploads():
    wf = workflow("release.yaml")
    assert wf["on"] == {"push": {"tags": ["v*"]}}
    (job,) = wf["jobs"].values()
    assert job["permissions"]["id-token"] == "write"  # keyless cosign
    scripts = [s.get("run", "") for s in job["steps"]]
    order = [
        next(i for i, s in enumerate(scripts) if pattern in s)
        for pattern in ("nix build -L .#bundle", "cosign sign-blob", "kernel-builder#kernel-builder -- upload")
    ]
    assert order == sorted(order)
    assert 'cosign sign-blob "$metadata" --bundle "$metadata.sigstore"' in scripts[order[1]]  # what kernels verifies
    assert "--inputs-from ." in scripts[order[2]]  # the kernel-builder flake.lock pins
    secret_steps = [s for s in job["steps"] if "secrets." in json.dumps(s)]
    assert secret_steps == [job["steps"][order[2]]] and "HF_TOKEN" in secret_steps[0]["env"]


@pytest.mark.parametrize("tag,ok", [("v1", True), ("v1.2.0", True), ("v2", False), ("v10", False)])
def test_release_refuses_a_tag_of_another_version(tag, ok):
    """The release's first check, run here as the workflow runs it (build.toml has version 1)."""
    (job,) = workflow("release.yaml")["jobs"].values()
    (check,) = [s for s in job["steps"] if s.get("name") == "Check that the tag names build.toml's version"]
    proc = subprocess.run(
        ["bash", "-ec", check["run"]], cwd=REPO_ROOT, env=dict(os.environ, TAG=tag), capture_output=True, text=True
    )
    assert (proc.returncode == 0) == ok, proc.stdout + proc.stderr
