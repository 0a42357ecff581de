"""The offline build reproduces kernel-builder's torch-noarch output (build.toml edition 6),
and the kernels project's own parsers and digest check accept it. Besides kernels' public
Metadata, the tests use kernels._rust for what has no public API (build.toml's parser, the
digest)."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from kernels import Metadata
from kernels._rust import Backend, Build, BuildLayout, Digest, DigestAlgorithm, DigestValidationError, Version

from rope_bwd_triton import REPO_ROOT, api
from rope_bwd_triton.build import KERNELS_MINVER, build_variants, read_config, unique_id

# metadata.json's fields as kernel-builder writes them (kernels-data's Metadata, serde kebab-case),
# each a property of kernels' public Metadata; upstream, source and provenance only where known.
BUILDER_FIELDS = {"name", "id", "version", "build-layout", "kernels-minver", "license", "python-depends"}
BUILDER_FIELDS |= {"kernel-depends", "backend", "digest"}
OPTIONAL_FIELDS = {"upstream", "source", "provenance"}


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    out = tmp_path_factory.mktemp("build")
    return {p.name: p for p in build_variants(out=out)}


def test_build_toml_is_edition_6_and_read_without_a_warning(capfd):
    """kernels 0.19 upgrades an older edition in memory and prints that the Nix builder needs 6."""
    build = Build.open(REPO_ROOT)
    config = read_config()
    assert capfd.readouterr() == ("", "")
    assert sorted(map(str, build.general.backends)) == sorted(map(str, [Backend.CPU, Backend.CUDA]))
    general = config["general"]
    assert (general["name"], general["version"], general["edition"]) == ("rope-bwd", 1, 6)
    assert general["build-layout"] == "files" and general["hub"]["repo-id"].endswith("/rope-bwd")
    assert "json" in config["torch-noarch"]["pyext"]  # tuned configurations ship
    assert config["torch-noarch"]["cuda_capabilities"] == ["8.0+PTX"]


def test_rebuild_writes_only_what_differs(tmp_path):
    """Loaded variants read some files later (configs/*.json, launch.py) while another
    process may rebuild: an unchanged file keeps its inode, a changed or missing one comes back
    readable, a stale one goes, and no scratch folder stays behind."""
    out = tmp_path / "build"
    cpu = build_variants(out=out)[0]
    kept, edited, config = cpu / "ops.py", cpu / "layers.py", next((cpu / "configs").glob("*.json"))
    before = kept.stat()
    edited.write_text("poison")
    config.unlink()
    (cpu / "stale.py").write_text("x = 1\n")
    (cpu / "old").mkdir()
    (cpu / "old" / "gone.json").write_text("{}")
    build_variants(out=out)
    assert (kept.stat().st_ino, kept.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    source = REPO_ROOT / "torch-ext" / "rope_bwd"
    assert edited.read_text() == (source / "layers.py").read_text()
    assert config.read_text() == (source / "configs" / config.name).read_text()
    assert edited.stat().st_mode == kept.stat().st_mode  # not a temporary file's private mode
    assert not (cpu / "stale.py").exists() and not (cpu / "old").exists()
    assert sorted(p.name for p in out.iterdir()) == ["torch-cpu", "torch-cuda"]


def test_variants_hold_the_package_and_generated_files(variants):
    assert set(variants) == {"torch-cpu", "torch-cuda"}
    shipped = {
        p.relative_to(REPO_ROOT / "torch-ext" / "rope_bwd")
        for p in (REPO_ROOT / "torch-ext" / "rope_bwd").rglob("*")
        if p.is_file() and p.suffix in (".py", ".json") and "__pycache__" not in p.parts
    }
    for path in variants.values():
        files = {p.relative_to(path) for p in path.rglob("*") if p.is_file()}
        assert shipped <= files
        assert files - shipped == {Path("_ops.py"), Path("metadata.json"), Path("symbols.json")}
        ops = (path / "_ops.py").read_text()
        assert f'f"_rope_bwd_{{get_backend()}}_{unique_id()}"' in ops and "def add_op_namespace_prefix" in ops


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_metadata_has_the_fields_kernel_builder_writes(variants, backend):
    """The keys are kernel-builder's, each read by kernels' public Metadata to the value meant."""
    raw = json.loads((variants[f"torch-{backend}"] / "metadata.json").read_text())
    assert set(raw) == BUILDER_FIELDS
    properties = {name for name in dir(Metadata) if not name.startswith("_") and name not in ("from_bytes",)}
    assert {f.replace("-", "_") for f in BUILDER_FIELDS | OPTIONAL_FIELDS} == properties - {"read_from_file"}
    meta = Metadata.read_from_file(variants[f"torch-{backend}"] / "metadata.json")
    assert (str(meta.name), meta.version, meta.license) == ("rope-bwd", 1, "Apache-2.0")
    assert meta.id == f"_rope_bwd_{backend}_{unique_id()}"
    assert meta.build_layout == BuildLayout.FILES and meta.kernels_minver == Version.from_str(KERNELS_MINVER["files"])
    assert meta.backend.backend_type == Backend.from_str(backend)
    assert meta.backend.archs == (["8.0+PTX"] if backend == "cuda" else None)
    assert (meta.python_depends, meta.kernel_depends, meta.provenance) == ([], [], None)


def test_symbols_json_describes_the_loaded_package(kernel, variants):
    """symbols.json, in every variant and under the digest: the functions and layers of the
    package that kernels loads (describe-api reads it without importing the kernel)."""
    want = api.symbols(api.describe(kernel))
    assert want["functions"] and want["layers"]
    for path in variants.values():
        assert json.loads((path / "symbols.json").read_text()) == want
        assert "symbols.json" in Metadata.read_from_file(path / "metadata.json").digest.files


def test_digest_matches_and_detects_tampering(variants, tmp_path):
    for path in variants.values():
        digest = Metadata.read_from_file(path / "metadata.json").digest
        assert digest is not None and digest.algorithm == DigestAlgorithm.SHA256
        digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, path))
        tampered = tmp_path / path.name
        shutil.copytree(path, tampered)
        (tampered / "ops.py").write_text((tampered / "ops.py").read_text() + "\n# changed\n")
        with pytest.raises(DigestValidationError):
            digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, tampered))


def test_get_kernel_picks_the_variant_of_this_torch(kernel):
    variant = Path(kernel.__file__).parent
    assert variant == REPO_ROOT / "build" / ("torch-cuda" if torch.version.cuda else "torch-cpu")
    assert kernel.__name__ == Metadata.read_from_file(variant / "metadata.json").id


_WITHOUT_TRITON = r"""
import importlib.abc, sys

class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, NoTriton())
import kernels, torch

rope = kernels.get_kernel(sys.argv[1], version=1)
gen = torch.Generator().manual_seed(0)
q, k = (torch.randn(5, 2, 8, generator=gen, requires_grad=True) for _ in range(2))
cos, sin = (torch.randn(5, 8, generator=gen) for _ in range(2))
compiled = torch.compile(rope.apply_rotary_pos_emb_vision, fullgraph=True)
for fn in (rope.apply_rotary_pos_emb_vision, compiled):
    q.grad = k.grad = None
    qe, ke = fn(q, k, cos, sin)
    (qe * ke).sum().backward()
    print([round(t.double().square().sum().item(), 6) for t in (qe, ke, q.grad, k.grad)])
print("triton imported:", "triton" in sys.modules)
"""


@pytest.mark.skipif(
    torch.version.cuda is not None,
    reason="a CUDA build of torch needs Triton itself; Triton-less machines run its CPU build",
)
def test_loads_and_compiles_without_triton(tmp_path):
    """CPU machines need no Triton: the package loads through get_kernel, runs forward and
    backward eagerly and torch.compile'd (same results), imports no Triton and logs nothing
    about it."""
    import os
    import subprocess
    import sys

    from rope_bwd_triton.build import repo_id

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(LOCAL_KERNELS=f"{repo_id()}={REPO_ROOT}", TORCHINDUCTOR_CACHE_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TRITON, repo_id()], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    eager, compiled, imported = proc.stdout.strip().splitlines()[-3:]
    assert eager == compiled
    assert imported == "triton imported: False"
    assert "triton" not in proc.stderr.lower(), proc.stderr


def test_kernels_minver_is_the_oldest_supported_kernels():
    """A files-layout build asks for the oldest kernels CI runs (requirements-oldest.txt), which
    checks kernels-minver before it loads a variant; the zip layout for one that reads zips."""
    oldest = re.search(r"^kernels==(\S+)$", (REPO_ROOT / "requirements-oldest.txt").read_text(), re.M)
    assert KERNELS_MINVER["files"] == oldest.group(1)
    assert Version.from_str(KERNELS_MINVER["zip"]) >= Version.from_str("0.19.0")
