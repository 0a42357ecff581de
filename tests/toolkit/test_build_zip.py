"""kernels 0.19's zip layout: `build --layout zip` writes each variant as kernels loads it
(metadata.json, symbols.json and <id>.zip holding the package), and the package reads its
tuned launch configurations out of the archive, not the defaults."""

import json
import os
import subprocess
import sys
import zipfile

import pytest
from kernels import Metadata
from kernels._rust import BuildLayout, Digest, DigestAlgorithm

from rope_bwd_triton import REPO_ROOT
from rope_bwd_triton.build import build_variants, repo_id

# In a fresh process (this one loaded the files layout under the same ids): load the zip
# variant through get_kernel, name the GPU an H200 so that the shipped table is read on CPU,
# and ask get_config for every entry of the table this Triton reads.
_LOAD = r"""
import json, sys, kernels, torch
from tests import offline
offline.install()
rope = kernels.get_kernel(sys.argv[1], version=1)
tuning = __import__(rope.__name__ + ".tuning", fromlist=["x"])
tuning._device_props = lambda device: ("NVIDIA H200", 132)
table = tuning.tuned_table("NVIDIA H200", tuning.triton_version())
got = {}
for key, entry in table.items():
    mode, D, R, b, bucket, *layout = key.split("-")
    R, S = int(R[1:]), tuning.bucket_size(bucket)
    cfg = tuning.get_config(mode, S, R // 2, R - R // 2, int(D[1:]), int(b[1:]), torch.device("cpu"), *layout)
    default = tuning.default_config(mode, S, R, int(D[1:]), int(b[1:]), 132)
    got[key] = {"tuned": cfg == entry, "default": cfg == default}
print(json.dumps({"file": rope.__file__, "config_dir": str(tuning.CONFIG_DIR), "got": got}))
"""


@pytest.fixture(scope="module")
def zip_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("zip-build")
    return out, {p.name: p for p in build_variants(out=out, layout="zip")}


def test_zip_variants_hold_metadata_symbols_and_the_archive(zip_build):
    _, variants = zip_build
    source = REPO_ROOT / "torch-ext" / "rope_bwd"
    shipped = {p.relative_to(source).as_posix() for p in source.rglob("*") if p.suffix in (".py", ".json")}
    for path in variants.values():
        meta = Metadata.read_from_file(path / "metadata.json")
        assert meta.build_layout == BuildLayout.ZIP
        archive = path / f"{meta.id}.zip"
        assert {p.name for p in path.iterdir()} == {"metadata.json", "symbols.json", archive.name}
        with zipfile.ZipFile(archive) as z:
            assert set(z.namelist()) - shipped == {"_ops.py"} and shipped <= set(z.namelist())
        meta.digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, path))
        files = json.loads((path / "symbols.json").read_text())
        assert files == json.loads((REPO_ROOT / "build" / path.name / "symbols.json").read_text())


def test_zip_variant_loads_and_reads_the_tuned_configs(zip_build, kernel, tmp_path):
    out, _ = zip_build
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # the repository first, then what the environment adds (the GPU machine's carried packages)
    path = [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env.update(LOCAL_KERNELS=f"{repo_id()}={out}", PYTHONPATH=os.pathsep.join(path))
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD, repo_id()], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    variant = "torch-cuda" if "cuda" in kernel.__name__ else "torch-cpu"
    assert result["file"].startswith(str(out / variant)) and ".zip" in result["file"]
    assert ".zip" in result["config_dir"]
    got = result["got"]
    assert got and all(g["tuned"] for g in got.values())
    assert any(not g["default"] for g in got.values())  # the table is not default_config's
