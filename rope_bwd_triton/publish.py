"""Publish the built variants and the card to the Hub, or install them offline.

The card (CARD.md, the README.md of the Hub repository's main branch) is written first, in
every mode, from README.md's card part, so that the facts both state have one source:
README.md between `<!-- card:start -->` and `<!-- card:end -->`, under the card's front
matter (library_name: kernels, which the Hub's kernels listing reads).

What goes where is the layout of kernel-builder's `upload` command (which the
release workflow runs on kernel-builder's own build):
    branch main           CARD.md                    ->  README.md        (the Hub page)
    branch v<version>     benchmarks/benchmark*.py   ->  benchmarks/...
                          build/torch-<backend>/...  ->  build/torch-<backend>/...
and, on v<version>, the files under those variants and the benchmarks/benchmark*.py
that the upload does not hold are deleted. `kernels.get_kernel(repo_id, version=<version>)`
reads branch v<version>; the version comes from build.toml.

    --card-only    write the card and stop
    --check-card   exit 1 if CARD.md is not README.md's card part; writes nothing
    --dry-run      print every operation; no network
    (default)      upload with huggingface_hub: branch v<version> created first (from
                   main, as kernel-builder does), then one commit per branch
    --to-cache DIR the offline twin: the same branches in the Hub-cache layout that
                   kernels reads with HF_HUB_OFFLINE=1 and KERNELS_CACHE=DIR:
                   DIR/kernels--<org>--<name>/refs/<branch> = commit id,
                   DIR/kernels--<org>--<name>/snapshots/<commit>/<that branch's files>
"""

import hashlib
import shutil
import sys
import tempfile
from pathlib import Path

from . import REPO_ROOT, cli
from .build import build_variants, read_config
from .build import repo_id as default_repo_id

REPO_TYPE = "kernel"  # kernels downloads with snapshot_download(repo_type="kernel")
CARD_BRANCH = "main"
CARD = REPO_ROOT / "CARD.md"
FRONT_MATTER = """---
library_name: kernels
license: apache-2.0
tags:
  - kernels
  - triton
  - rotary-embedding
  - vision
---
"""
START, END = "<!-- card:start -->", "<!-- card:end -->"


def render_card(readme: str) -> str:
    try:
        body = readme.split(START, 1)[1].split(END, 1)[0]
    except IndexError:
        raise cli.UsageError(f"README.md has no part between {START} and {END}") from None
    return f"{FRONT_MATTER}\n# rope-bwd\n\n{body.strip()}\n"


def card_text() -> str:
    return render_card((REPO_ROOT / "README.md").read_text())


def branch(root: Path = REPO_ROOT) -> str:
    return f"v{read_config(root)['general']['version']}"


def operations(root: Path = REPO_ROOT, build: Path | None = None) -> dict[str, list[tuple[Path, str]]]:
    """Build the variants, then {branch: sorted [(local file, path in repo)]} to add."""
    build = build or root / "build"
    version_files = [(p, f"benchmarks/{p.name}") for p in (root / "benchmarks").glob("benchmark*.py")]
    for variant in build_variants(root, out=build):
        version_files += [
            (p, f"build/{p.relative_to(build).as_posix()}")
            for p in variant.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        ]
    return {CARD_BRANCH: [(CARD, "README.md")], branch(root): sorted(version_files, key=lambda f: f[1])}


def stale_patterns(files) -> list[str]:
    """What the commit replaces on the version branch: its variants and benchmark*.py."""
    variants = sorted({"/".join(rel.split("/")[:2]) for _, rel in files if rel.startswith("build/")})
    return [f"{v}/**" for v in variants] + ["benchmarks/benchmark*.py"]


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


def install_to_cache(cache: Path, ops, repo_id: str) -> dict[str, Path]:
    """The offline twin of the upload: {branch: its snapshot folder}."""
    from huggingface_hub.file_download import repo_folder_name

    storage = Path(cache) / repo_folder_name(repo_id=repo_id, repo_type=REPO_TYPE)
    snapshots = {}
    for ref, files in ops.items():
        commit = commit_id(files)
        snapshot = storage / "snapshots" / commit
        if snapshot.exists():
            shutil.rmtree(snapshot)
        snapshots[ref] = stage(files, snapshot)
        (storage / "refs").mkdir(parents=True, exist_ok=True)
        (storage / "refs" / ref).write_text(commit)
    return snapshots


def install_build(cache: Path, repo_id: str | None = None) -> dict[str, Path]:
    """Build, then install into `cache` as the upload would publish it (the offline twin)."""
    return install_to_cache(cache, operations(), repo_id or default_repo_id())


def upload(ops, repo_id: str) -> list[str]:
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, repo_type=REPO_TYPE, exist_ok=True)
    for ref in ops:
        if ref != CARD_BRANCH:
            api.create_branch(repo_id, branch=ref, repo_type=REPO_TYPE, exist_ok=True)
    urls = []
    for ref, files in ops.items():
        with tempfile.TemporaryDirectory() as tmp:
            info = api.upload_folder(
                repo_id=repo_id,
                repo_type=REPO_TYPE,
                revision=ref,
                folder_path=stage(files, Path(tmp)),
                commit_message=f"Upload {'the card' if ref == CARD_BRANCH else ref + ' build'}",
                delete_patterns=None if ref == CARD_BRANCH else stale_patterns(files),
            )
        urls.append(info.commit_url)
    return urls


def add_arguments(parser):
    parser.add_argument(
        "--repo-id",
        type=cli.repo_id,
        default=None,
        help="Hub repository, <namespace>/<name> (default: [general.hub] repo-id of build.toml)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--card-only", action="store_true", help=f"write {CARD.name} from README.md's card part; no more")
    mode.add_argument(
        "--check-card", action="store_true", help=f"exit 1 if {CARD.name} is not README.md's card part; write nothing"
    )
    mode.add_argument("--dry-run", action="store_true", help="print every operation of the upload; no network")
    mode.add_argument("--to-cache", type=Path, metavar="DIR", help="install into a Hub-cache layout instead")


def _shown(path: Path) -> Path:
    return path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path


def main(args) -> int:
    repo_id = args.repo_id or default_repo_id()
    if args.check_card:
        if CARD.read_text() != card_text():
            print(
                f"publish: {CARD} is out of date; run `python -m rope_bwd_triton publish --card-only`", file=sys.stderr
            )
            return 1
        return 0
    CARD.write_text(card_text())
    print(f"wrote {CARD}")
    if args.card_only:
        return 0
    ops = operations()
    if args.dry_run:
        print(f"would upload to {REPO_TYPE} repository {repo_id} (kernel-builder's upload layout):")
        for ref, files in ops.items():
            print(f"branch {ref}:")
            for src, rel in files:
                print(f"  add {_shown(src)} -> {rel}")
            if ref != CARD_BRANCH:
                print(f"  delete files matching {', '.join(stale_patterns(files))} that are not added above")
    elif args.to_cache:
        for ref, snapshot in install_to_cache(args.to_cache, ops, repo_id).items():
            print(f"installed branch {ref} ({len(ops[ref])} files) into {snapshot}")
        print(
            f"load offline with: HF_HUB_OFFLINE=1 KERNELS_CACHE={args.to_cache} and "
            f"kernels.get_kernel({repo_id!r}, version={branch()[1:]}, trust_remote_code=True)"
        )
    else:
        for url in upload(ops, repo_id):
            print(f"committed: {url}")
    return 0
