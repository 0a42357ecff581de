"""No silent skips. A test may skip only for one of the reasons below, and only where that reason
holds on the machine that runs it; every run prints its skips grouped by reason and fails on any
other skip (tests/conftest.py installs the hooks, so scripts/test.sh's pytest stages, hub CI and
the GPU runs all go through them; `-p tests.skips` adds them to any other pytest run).

The interpreter reasons are allowed because each pass refuses its own: a test the CPU pass skips
as "only under TRITON_INTERPRET=1" must run in scripts/test.sh's interpreter pass, where that
reason fails the run, and the converse; on a GPU the same tests run on CUDA tensors.
"""

import os
import re
from collections import Counter

import torch

from .helpers import HAS_CUDA, INTERPRET

# A GPU runner sets ROPE_EXPECT_CUDA=1: where torch sees no GPU there, the GPU tests must fail,
# not skip as on a CPU machine.
EXPECT_CUDA = os.environ.get("ROPE_EXPECT_CUDA") == "1"
# reason (how the skip's message ends) -> whether it holds here
ALLOWED = {
    "needs a CUDA GPU": lambda: not HAS_CUDA and not EXPECT_CUDA,
    "needs 2 CUDA GPUs": lambda: torch.cuda.device_count() < 2,
    "runs only under TRITON_INTERPRET=1": lambda: not INTERPRET,
    "runs only without TRITON_INTERPRET=1": lambda: INTERPRET,
}
# a transformers vision family the installed transformers does not have (the test looked)
FAMILY_ABSENT = re.compile(r"transformers \S+ has no \w+ \(or it defines no vision rotary\)$")


def reason(report) -> str:
    """The message a skip report carries (pytest keeps it as (path, line, "Skipped: <message>"))."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def refused(text: str) -> bool:
    """Whether a skip with this message is outside the allowed reasons, or states one that is false here."""
    if FAMILY_ABSENT.search(text):
        return False
    return not any(text.endswith(allowed) and holds() for allowed, holds in ALLOWED.items())


def by_reason(reports) -> Counter:
    return Counter(reason(r) for r in reports)


def summary(reports) -> tuple[list, bool]:
    """Lines for the terminal (count and message per reason, the refused marked) and whether any was refused."""
    counts = by_reason(reports)
    lines, bad = [], False
    for text, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        no = refused(text)
        bad |= no
        lines.append(f"{n:6d}  {text}" + ("   <- not an allowed reason here (tests/skips.py)" if no else ""))
    return lines, bad


def _reports(config) -> list:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return reporter.stats.get("skipped", []) if reporter else []


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == 0 and summary(_reports(session.config))[1]:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    lines, bad = summary(terminalreporter.stats.get("skipped", []))
    if not lines:
        return
    terminalreporter.section("skips by reason")
    for line in lines:
        terminalreporter.write_line(line)
    if bad:
        allowed = "; ".join([*ALLOWED, "transformers <version> has no <family> ..."])
        terminalreporter.write_line(f"FAILED: a skip outside the allowed reasons ({allowed})", red=True)
