"""A command's child run in a fresh process with empty Triton and inductor caches, as a new
training run starts: overhead runs each implementation so (and each fast-launch setting),
e2e --varres each variant."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from . import REPO_ROOT

RESULT = "--child-result"  # the file a child writes its JSON to


def add_result_argument(parser):
    parser.add_argument(RESULT, type=Path, help=argparse.SUPPRESS)


def run_fresh(argv, workdir: Path, name: str, **env) -> dict:
    """`python -m rope_bwd_triton <argv> --child-result FILE` in a new process whose Triton and
    inductor caches are new folders under workdir, `env` added to its environment: the JSON the
    child wrote to FILE, or {"error": the last line of its stderr}."""
    result = workdir / f"{name}.json"
    env = dict(
        os.environ,
        TRITON_CACHE_DIR=str(workdir / f"triton-{name}"),
        TORCHINDUCTOR_CACHE_DIR=str(workdir / f"inductor-{name}"),
        **env,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "rope_bwd_triton", *argv, RESULT, str(result)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]}
    return json.loads(result.read_text())
