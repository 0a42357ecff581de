"""Publish the built variants and the card to the Hub, or install them offline.

What goes where (one tree, used three ways):
    build/torch-<backend>/...   ->  build/torch-<backend>/...   (every built variant)
    CARD.md                     ->  README.md                   (the Hub page)
on branch `v<version>` (version from build.toml) of the kernel repository, which
is where `kernels.get_kernel(repo_id, version=<version>)` looks.

    --dry-run      list every file and its destination; no network
    (default)      upload with huggingface_hub: one commit on branch v<version>,
                   replacing whatever build/ held there before
    --to-cache DIR the offline twin: the same tree in the Hub-cache layout that
                   kernels reads with HF_HUB_OFFLINE=1 and KERNELS_CACHE=DIR:
                   DIR/kernels--<org>--<name>/refs/v<version> = commit id,
                   DIR/kernels--<org>--<name>/snapshots/<commit>/<tree>
"""

import hashlib
import shutil
import tempfile
from pathlib import Path

from . import REPO_ROOT, cli
from .build import build_variants, read_config, repo_id as default_repo_id

REPO_TYPE = "kernel"  # kernels downloads with snapshot_download(repo_type="kernel")


def branch(root: Path = REPO_ROOT) -> str:
    return f"v{read_config(root)['general']['version']}"


def publish_files(root: Path = REPO_ROOT, build: Path | None = None) -> list[tuple[Path, str]]:
    """Build the variants, then (local file, path in repo) for everything to send, sorted."""
    build = build or root / "build"
    files = []
    for variant in build_variants(root, out=build):
        for path in sorted(variant.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files.append((path, path.relative_to(build.parent).as_posix()))
    files.append((root / "CARD.md", "README.md"))
    return sorted(files, key=lambda f: f[1])


def stage(files, dest: Path) -> Path:
    for src, rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest / rel)
    return dest


def commit_id(files) -> str:
    """A stand-in commit id (40 hex, like git's) that depends only on the content."""
    h = hashlib.sha1()
    for src, rel in files:
        h.update(f"{rel}\0{hashlib.sha256(Path(src).read_bytes()).hexdigest()}\n".encode())
    return h.hexdigest()


def install_to_cache(cache: Path, files, repo_id: str, ref: str) -> Path:
    """The offline twin of the upload; returns the snapshot folder."""
    from huggingface_hub.file_download import repo_folder_name

    storage = Path(cache) / repo_folder_name(repo_id=repo_id, repo_type=REPO_TYPE)
    commit = commit_id(files)
    snapshot = storage / "snapshots" / commit
    if snapshot.exists():
        shutil.rmtree(snapshot)
    stage(files, snapshot)
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / ref).write_text(commit)
    return snapshot


def install_build(cache: Path, repo_id: str | None = None) -> Path:
    """Build, then install into `cache` as the upload would publish it (the offline twin)."""
    return install_to_cache(cache, publish_files(), repo_id or default_repo_id(), branch())


def upload(files, repo_id: str, ref: str) -> str:
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, repo_type=REPO_TYPE, exist_ok=True)
    api.create_branch(repo_id, branch=ref, repo_type=REPO_TYPE, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        info = api.upload_folder(
            repo_id=repo_id, repo_type=REPO_TYPE, revision=ref, folder_path=stage(files, Path(tmp)),
            commit_message=f"Upload {ref} build", delete_patterns=["build/**"],
        )
    return info.commit_url


def add_arguments(parser):
    parser.add_argument("--repo-id", type=cli.repo_id, default=None,
                        help="Hub repository, <namespace>/<name> (default: [general.hub] repo-id of build.toml)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="list what would be sent and where; no network")
    mode.add_argument("--to-cache", type=Path, metavar="DIR", help="install into a Hub-cache layout instead")


def main(args) -> int:
    repo_id = args.repo_id or default_repo_id()
    ref = branch()
    files = publish_files()
    if args.dry_run:
        print(f"would upload {len(files)} files to {REPO_TYPE} repository {repo_id}, branch {ref}:")
        for src, rel in files:
            print(f"  {src.relative_to(REPO_ROOT)} -> {repo_id}@{ref}:{rel}")
    elif args.to_cache:
        snapshot = install_to_cache(args.to_cache, files, repo_id, ref)
        print(f"installed {len(files)} files into {snapshot}")
        print(f"load offline with: HF_HUB_OFFLINE=1 KERNELS_CACHE={args.to_cache} and "
              f"kernels.get_kernel({repo_id!r}, version={ref[1:]}, trust_remote_code=True)")
    else:
        print(f"uploaded {len(files)} files: {upload(files, repo_id, ref)}")
    return 0
