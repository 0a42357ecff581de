"""The repository's pytest set-up (hub CI, which has no toolkit, runs tests/ without
it): build the Hub variants into build/ once, and point LOCAL_KERNELS at this
checkout, so that tests load them through kernels.get_kernel as users do."""

import os

from rope_bwd_triton import REPO_ROOT
from rope_bwd_triton.build import build_variants, repo_id


def pytest_configure(config):
    # Once: here in a plain run, in the controller under pytest-xdist (workers building the
    # same folder at once would race; they inherit LOCAL_KERNELS).
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        build_variants()
    os.environ["LOCAL_KERNELS"] = f"{repo_id()}={REPO_ROOT}"
