"""Offline twin of kernel-builder's torch-noarch build.

kernel-builder needs Nix and the network, so this writes the same output:
    build/torch-<backend>/            one variant per backend in build.toml
        <the package's files>         torch-ext/rope_bwd/*, extensions from [torch-noarch] pyext
        _ops.py                       ops namespace _rope_bwd_<backend>_<unique id>
        metadata.json                 name, id, version, license, python-depends, backend, digest
        rope_bwd/__init__.py          compatibility directory re-exporting the variant
The unique id comes from the git revision (short hash, `_dirty` when the tree has
uncommitted changes), so that two builds can be loaded in one process.
"""

import json
import os
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path

from . import REPO_ROOT

OPS_TEMPLATE = '''import torch


def get_backend() -> str:
    """Detect the backend by inspecting torch."""
    if torch.version.cuda is not None:
        return "cuda"
    elif torch.version.hip is not None:
        return "rocm"
    elif torch.backends.mps.is_available():
        return "metal"
    elif hasattr(torch.version, "xpu") and torch.version.xpu is not None:
        return "xpu"
    return "cpu"


_OPS_NAME = f"_{KERNEL_NAME}_{{get_backend()}}_{UNIQUE_ID}"

ops = getattr(torch.ops, _OPS_NAME)


def add_op_namespace_prefix(op_name: str) -> str:
    """Prefix op by namespace."""
    return f"{{_OPS_NAME}}::{{op_name}}"
'''

COMPAT_TEMPLATE = '''"""Compatibility directory: re-exports the variant one level up, for loaders
that look for <variant>/{module}/__init__.py."""

import importlib.util
import json
import sys
from pathlib import Path

_root = Path(__file__).resolve().parent.parent
_name = json.loads((_root / "metadata.json").read_text())["id"]
if _name not in sys.modules:  # not loaded yet under the id kernels uses
    _spec = importlib.util.spec_from_file_location(_name, _root / "__init__.py")
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[_name] = _module
    _spec.loader.exec_module(_module)
_variant = sys.modules[_name]
__all__ = list(_variant.__all__)
globals().update({{_k: getattr(_variant, _k) for _k in __all__}})
'''


def read_config(root: Path = REPO_ROOT) -> dict:
    """build.toml, checked by the kernels project's own parser first."""
    from kernels._rust import Build

    Build.open(root)
    return tomllib.loads((root / "build.toml").read_text())


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


def build_variants(root: Path = REPO_ROOT, out: Path | None = None) -> list[Path]:
    """Write build/torch-<backend>/ for every backend; returns the variant paths."""
    from kernels._rust import Digest, DigestAlgorithm, Metadata

    config = read_config(root)
    general = config["general"]
    name = general["name"]
    module = name.replace("-", "_")
    source = root / "torch-ext" / module
    exts = {"." + e for e in config.get("torch-noarch", {}).get("pyext", ["py", "pyi"])}
    uid = unique_id(root)
    out = out or root / "build"

    variants = []
    out.mkdir(parents=True, exist_ok=True)
    for backend in general["backends"]:
        variant = out / f"torch-{backend}"
        with tempfile.TemporaryDirectory(dir=out, prefix=f".torch-{backend}-") as scratch:
            fresh = Path(scratch)
            for path in sorted(source.rglob("*")):
                if path.is_file() and path.suffix in exts and "__pycache__" not in path.parts:
                    dest = fresh / path.relative_to(source)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, dest)
            (fresh / "_ops.py").write_text(OPS_TEMPLATE.format(KERNEL_NAME=module, UNIQUE_ID=uid))
            (fresh / module).mkdir()
            (fresh / module / "__init__.py").write_text(COMPAT_TEMPLATE.format(module=module))

            digest = Digest.hash_variant(DigestAlgorithm.SHA256, fresh)
            metadata = {
                "name": name,
                "id": f"_{module}_{backend}_{uid}",
                "version": general["version"],
                "license": general["license"],
                "python-depends": general.get("python-depends", []),
                "backend": {"type": backend},
                "digest": {"algorithm": "sha256", "files": dict(sorted(digest.files.items()))},
            }
            (fresh / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
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


def main(args) -> int:
    for variant in build_variants(out=args.out):
        meta = json.loads((variant / "metadata.json").read_text())
        print(f"built {variant} (id {meta['id']}, {len(meta['digest']['files'])} files)")
    print(f"load with: LOCAL_KERNELS={repo_id()}={REPO_ROOT} and kernels.get_kernel({repo_id()!r}, version=1)")
    return 0
