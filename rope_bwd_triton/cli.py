"""What the commands share about their arguments: a bad value is refused with a one-line
error and exit status 2 (argparse's convention), before the command writes anything;
argparse types for the values that can be judged alone, UsageError for the rest."""

import argparse


class UsageError(Exception):
    """A bad argument found after parsing: `python -m rope_bwd_triton` prints it as one line
    and exits with status 2."""


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    n = _int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {n}")
    return n


def nonnegative_int(text: str) -> int:
    n = _int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {n}")
    return n


def positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return x


def subset_of(choices, what: str):
    """The argparse type of a comma-separated subset of `choices` (empty allowed), in the order given."""

    def parse(text: str) -> list:
        picked = [c for c in text.split(",") if c]
        unknown = sorted(set(picked) - set(choices))
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {unknown}; choose from {','.join(choices)}")
        return picked

    return parse


def head_dim(text: str) -> int:
    """What the package accepts: even, 2..256."""
    d = _int(text)
    if d % 2 or not 2 <= d <= 256:
        raise argparse.ArgumentTypeError(f"must be even and in 2..256, got {d}")
    return d


def device(text: str) -> str:
    """cpu, or cuda[:N] where this machine has that GPU."""
    import torch

    try:
        dev = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected cpu or cuda[:N], got {text!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(
                f"{text}: this machine has no CUDA GPU (torch.cuda.is_available() is False)"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    elif dev.type != "cpu":
        raise argparse.ArgumentTypeError(f"expected cpu or cuda[:N], got {text!r}")
    return text


def existing_file(text: str):
    """A file the command reads."""
    from pathlib import Path

    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return path


def repo_id(text: str) -> str:
    """A Hub repository id, <namespace>/<name> (kernels looks kernels up by both)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError as e:
        raise argparse.ArgumentTypeError(str(e).splitlines()[0]) from None
    if text.count("/") != 1:
        raise argparse.ArgumentTypeError(f"expected <namespace>/<name>, got {text!r}")
    return text
