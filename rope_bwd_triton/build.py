"""Offline twin of kernel-builder's torch-noarch build (build.toml edition 6).

kernel-builder needs Nix and the network, so this writes the same output:
    build/torch-<backend>/            one variant per backend in build.toml
        <the package's files>         torch-ext/rope_bwd/*, extensions from [torch-noarch] pyext
        _ops.py                       ops namespace _rope_bwd_<backend>_<unique id>
        symbols.json                  the public functions and layers (`kernels describe-api`), taken
                                      from the loaded variant as the builder's get_kernel check does
        metadata.json                 kernel-builder's fields (`metadata`), the digest of the rest
With build-layout "zip" (build.toml [general], or --layout), the package's files and _ops.py
are one archive, <variant>/<id>.zip, which kernels 0.19 imports from (its zipimport loader).
The unique id comes from the git revision (short hash, `_dirty` when the tree has
uncommitted changes), so that two builds can be loaded in one process.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from . import REPO_ROOT

LAYOUTS = ("files", "zip")
# kernels-minver, by layout: the oldest supported kernels (requirements-oldest.txt), which checks
# the field before loading; the zip layout needs 0.19, the oldest run with it is 0.19.1. Three
# components: kernels 0.17 and 0.18 parse the field as X.Y.Z.
KERNELS_MINVER = {"files": "0.18.3", "zip": "0.19.1"}

OPS_TEMPLATE = '''import torch


def get_backend() -> str:
    """The backend this torch runs on, as kernel-builder's noarch builds name it."""
    if hasattr(torch.backends, "tpu"):
        return "tpu"
    if hasattr(torch, "neuron"):  # before cuda: a CUDA torch can load Neuron's extension
        return "neuron"
    if torch.version.cuda is not None:
        return "cuda"
    if torch.version.hip is not None:
        return "rocm"
    if torch.backends.mps.is_available():
        return "metal"
    if getattr(torch.version, "xpu", None) is not None:
        return "xpu"
    return "cpu"


_OPS_NAME = f"_{KERNEL_NAME}_{{get_backend()}}_{UNIQUE_ID}"

ops = getattr(torch.ops, _OPS_NAME)


def add_op_namespace_prefix(op_name: str) -> str:
    """Prefix op by namespace."""
    return f"{{_OPS_NAME}}::{{op_name}}"
'''


def read_config(root: Path = REPO_ROOT) -> dict:
    """build.toml as TOML. The parser kernel-builder and kernels share checks it in the tests
    (tests/toolkit/test_build.py), not here: the oldest supported kernels loads the variants but
    its parser predates edition 6, and the tests lay it over this toolkit."""
    return tomllib.loads((root / "build.toml").read_text())


def _hash_variant(variant: Path) -> dict:
    """metadata.json's digest, as kernel-builder's `hash` computes it: every file of the
    variant but metadata.json. kernels has no public API for it: kernels._rust.Digest."""
    from kernels._rust import Digest, DigestAlgorithm

    files = Digest.hash_variant(DigestAlgorithm.SHA256, variant).files
    return {"algorithm": "sha256", "files": dict(sorted(files.items()))}


def git_state(root: Path = REPO_ROOT):
    """(commit, dirty) of the checkout, or None outside git."""

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None


def unique_id(root: Path = REPO_ROOT) -> str:
    state = git_state(root)
    if state is None:
        return "nogit"
    commit, dirty = state
    return commit[:7] + ("_dirty" if dirty else "")


def metadata(config: dict, backend: str, kernel_id: str, layout: str) -> dict:
    """metadata.json without its digest, in the order and with the fields kernel-builder writes
    (kernels-data's Metadata): upstream, source and provenance only where there is one (this
    build is not kernel-builder's, so it claims no builder provenance); backend.archs from
    [torch-noarch] for CUDA."""
    general = config["general"]
    archs = config.get("torch-noarch", {}).get("cuda_capabilities") if backend == "cuda" else None
    meta = {"name": general["name"], "id": kernel_id, "version": general["version"], "build-layout": layout}
    meta |= {"kernels-minver": KERNELS_MINVER[layout], "license": general["license"]}
    meta |= {key: general[key] for key in ("upstream", "source") if key in general}
    meta |= {"python-depends": general.get("python-depends", []), "kernel-depends": general.get("kernel-depends", [])}
    meta["backend"] = {"type": backend} | ({"archs": archs} if archs else {})
    return meta


def _write_package(source: Path, exts: set, dest: Path, module: str, uid: str) -> None:
    for path in sorted(source.rglob("*")):
        if path.is_file() and path.suffix in exts and "__pycache__" not in path.parts:
            target = dest / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    (dest / "_ops.py").write_text(OPS_TEMPLATE.format(KERNEL_NAME=module, UNIQUE_ID=uid))


def _zip(package: Path, archive: Path) -> None:
    """The package at the archive's root, entries sorted and dated 1980-01-01: the same
    sources give the same bytes, hence the same digest."""
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(p for p in package.rglob("*") if p.is_file()):
            info = zipfile.ZipInfo(path.relative_to(package).as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            z.writestr(info, path.read_bytes(), zipfile.ZIP_DEFLATED)


def _symbols(fresh: Path, built: list[Path]) -> str:
    """symbols.json: that of a build in `built` holding the same files (the previous build, this
    build's other backend, the checkout's build/: the package is the same), else from loading
    `fresh` in a new process (as kernel-builder's get_kernel check loads its output)."""
    described = [p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file() and p.name != "metadata.json"]
    for other in built:
        same = all((other / r).is_file() and (other / r).read_bytes() == (fresh / r).read_bytes() for r in described)
        if same and (other / "symbols.json").is_file():
            return (other / "symbols.json").read_text()
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_KERNELS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    script = "import sys; from rope_bwd_triton import api; print(api.symbols_json(sys.argv[1]), end='')"
    proc = subprocess.run([sys.executable, "-c", script, str(fresh)], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"loading the built variant {fresh.name} failed:\n{proc.stderr}")
    return proc.stdout


def build_variants(root: Path = REPO_ROOT, out: Path | None = None, layout: str | None = None) -> list[Path]:
    """Write build/torch-<backend>/ for every backend; returns the variant paths. layout:
    "files" or "zip" (default: build.toml's build-layout, else "files")."""
    from kernels import Metadata

    config = read_config(root)
    general = config["general"]
    layout = layout or general.get("build-layout", "files")
    module = general["name"].replace("-", "_")
    exts = {"." + e for e in config.get("torch-noarch", {}).get("pyext", ["py", "pyi"])}
    uid = unique_id(root)
    out = out or root / "build"

    variants = []
    out.mkdir(parents=True, exist_ok=True)
    for backend in general["backends"]:
        variant = out / f"torch-{backend}"
        meta = metadata(config, backend, f"_{module}_{backend}_{uid}", layout)
        with tempfile.TemporaryDirectory(dir=out, prefix=f".torch-{backend}-") as scratch:
            package, fresh = Path(scratch) / "package", Path(scratch) / "variant"
            _write_package(root / "torch-ext" / module, exts, package, module, uid)
            if layout == "zip":
                fresh.mkdir()
                _zip(package, fresh / f"{meta['id']}.zip")
            else:
                package.rename(fresh)
            (fresh / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")
            earlier = [variant, *variants, root / "build" / variant.name]  # the checkout's own build last
            (fresh / "symbols.json").write_text(_symbols(fresh, earlier))
            meta["digest"] = _hash_variant(fresh)
            (fresh / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")
            Metadata.read_from_file(fresh / "metadata.json")  # the loader's parser must accept it
            _sync(fresh, variant)
        variants.append(variant)
    return variants


def _sync(src: Path, dest: Path) -> None:
    """Make `dest` hold exactly the files of `src`, writing only those that differ, each
    replaced in one step. Processes that loaded the variant read some of its files later
    (configs/*.json, the Triton modules on first GPU use), and the test suite's workers build
    while others run: deleting and rewriting the folder made those reads fail at random."""
    for path in sorted(src.rglob("*")):
        target = dest / path.relative_to(src)
        if path.is_dir() or (target.is_file() and target.read_bytes() == path.read_bytes()):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(target.parent / "__pycache__", ignore_errors=True)  # bytecode of the old file
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}-", delete=False) as tmp:
            tmp.write(path.read_bytes())
        shutil.copymode(path, tmp.name)  # a temporary file is private; the build is not
        os.replace(tmp.name, target)
    for path in sorted(dest.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        rel = path.relative_to(dest)
        if "__pycache__" not in rel.parts and not (src / rel).exists():
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def repo_id(root: Path = REPO_ROOT) -> str:
    return read_config(root)["general"]["hub"]["repo-id"]


def add_arguments(parser):
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <repo>/build)")
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default=None,
        help="variant layout (default: build.toml's build-layout, else files)",
    )


def main(args) -> int:
    for variant in build_variants(out=args.out, layout=args.layout):
        meta = json.loads((variant / "metadata.json").read_text())
        print(f"built {variant} (id {meta['id']}, {len(meta['digest']['files'])} files)")
    print(f"load with: LOCAL_KERNELS={repo_id()}={REPO_ROOT} and kernels.get_kernel({repo_id()!r}, version=1)")
    return 0
