"""The public API guard (rope_bwd_triton/api.py): api/v<version>.json is the package's API, and
a change is named, a breaking one (a name removed, a signature changed) demanding a version
bump, an addition only a regeneration (`python -m rope_bwd_triton api --write`)."""

import copy
import json
import shutil

import pytest

from rope_bwd_triton import REPO_ROOT, api, cli
from rope_bwd_triton.build import read_config


@pytest.fixture
def described(kernel):
    return api.describe(kernel)


def test_the_committed_snapshot_is_the_packages_api(described):
    version = read_config()["general"]["version"]
    assert api.check(described, version) == []
    assert {"rope_fwd", "rope_bwd", "apply_rotary_pos_emb_vision"} <= set(described["functions"])
    assert all(layer["has_backward"] and layer["can_torch_compile"] for layer in described["layers"].values())


@pytest.fixture
def repo(tmp_path, described):
    """A checkout whose snapshot of version 1 is the package's API."""
    shutil.copytree(REPO_ROOT / "api", tmp_path / "api")
    return tmp_path


def _changed(described, change):
    new = copy.deepcopy(described)
    change(new)
    return new


@pytest.mark.parametrize(
    "change,line",
    [
        (lambda d: d["functions"].pop("rope_fwd"), "removed function rope_fwd"),
        (lambda d: d["functions"].update(rope_bwd="(grad_q_embed)"), "changed function rope_bwd"),
        (lambda d: d["layers"]["ApplyRotaryPosEmbVision"].update(has_backward=False),
         "changed layer ApplyRotaryPosEmbVision"),
        (lambda d: d["modules"].remove("layers"), "removed module layers"),
    ],
    ids=["removed", "signature", "layer flag", "module"],
)  # fmt: skip
def test_a_breaking_change_needs_a_version_bump(repo, described, change, line):
    new = _changed(described, change)
    problems = api.check(new, 1, repo)
    assert problems[0] == line and "bump [general] version" in problems[-1]
    with pytest.raises(cli.UsageError, match="bump"):
        api.write(new, 1, repo)
    assert api.check(described, 1, repo) == []  # the refused write left the snapshot alone
    assert api.check(new, 2, repo)[0].startswith("no snapshot of version 2")
    api.write(new, 2, repo)  # after the bump
    assert api.check(new, 2, repo) == [] and json.loads((repo / "api" / "v2.json").read_text()) == new


def test_an_addition_needs_only_a_regeneration(repo, described):
    new = _changed(described, lambda d: d["functions"].update(unrotate="(q, k)"))
    assert api.check(new, 1, repo) == ["added function unrotate", api.check(new, 1, repo)[-1]]
    assert "no bump needed" in api.check(new, 1, repo)[-1] and "api --write" in api.check(new, 1, repo)[-1]
    api.write(new, 1, repo)
    assert api.check(new, 1, repo) == []


def test_symbols_are_what_describe_api_reads(described):
    symbols = api.symbols(described)
    assert symbols["schema_version"] == 1
    assert [f["name"] for f in symbols["functions"]] == sorted(described["functions"])
    assert {layer["name"]: layer["attributes"] for layer in symbols["layers"]} == {
        name: {"has_backward": layer["has_backward"], "can_torch_compile": layer["can_torch_compile"]}
        for name, layer in described["layers"].items()
    }
