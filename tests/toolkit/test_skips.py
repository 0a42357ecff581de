"""tests/skips.py: a pytest run prints its skips grouped by reason and fails on a skip whose
reason is not allowed, or is allowed but false on this machine."""

import os
import subprocess
import sys

import pytest
import torch

from rope_bwd_triton import REPO_ROOT

from .. import skips
from ..helpers import HAS_CUDA

BODY = """
import pytest

@pytest.mark.parametrize("i", [0, 1])
def test_interpreter_only(i):
    pytest.skip("the kernel on CPU tensors: runs only under TRITON_INTERPRET=1")

def test_family():
    pytest.skip("transformers 9.9.9 has no qwen9_vl (or it defines no vision rotary)")

def test_passes():
    pass
"""


def run(tmp_path, body, **env):
    (tmp_path / "test_x.py").write_text(body)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.skips", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=REPO_ROOT,
        env={**{k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "ROPE_EXPECT_CUDA")}, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_allowed_reasons_that_hold_pass_and_are_counted(tmp_path):
    proc = run(tmp_path, BODY)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skips by reason" in proc.stdout
    assert "     2  the kernel on CPU tensors: runs only under TRITON_INTERPRET=1\n" in proc.stdout
    assert "     1  transformers 9.9.9 has no qwen9_vl" in proc.stdout
    assert "not an allowed reason" not in proc.stdout


def test_an_allowed_reason_that_does_not_hold_fails(tmp_path):
    proc = run(tmp_path, BODY, TRITON_INTERPRET="1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "runs only under TRITON_INTERPRET=1   <- not an allowed reason here" in proc.stdout
    assert "1 passed, 3 skipped" in proc.stdout


def test_a_gpu_runner_refuses_to_skip_for_want_of_cuda(tmp_path):
    body = "import pytest\n\ndef test_gpu():\n    pytest.skip('needs a CUDA GPU')\n"
    proc = run(tmp_path, body, ROPE_EXPECT_CUDA="1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "     1  needs a CUDA GPU   <- not an allowed reason here" in proc.stdout


def test_another_reason_fails(tmp_path):
    proc = run(tmp_path, BODY.replace("transformers 9.9.9 has no qwen9_vl", "flaky on Tuesdays"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "flaky on Tuesdays (or it defines no vision rotary)   <- not an allowed reason here" in proc.stdout


@pytest.mark.parametrize(
    "text,refused",
    [
        ("needs a CUDA GPU", HAS_CUDA),
        ("tune: needs a CUDA GPU, or an hour", True),  # the reason must be how the message ends
        ("needs 2 CUDA GPUs", torch.cuda.device_count() >= 2),
        ("transformers 5.24.0 has no glm9v (or it defines no vision rotary)", False),
        ("transformers 5.24.0 is too old", True),
        ("needs 40 GiB of free GPU memory", True),
    ],
)
def test_refused(text, refused):
    assert skips.refused(text) == refused
