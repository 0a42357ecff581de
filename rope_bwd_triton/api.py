"""The package's public API, described and guarded.

`describe` reads it from the loaded package: the functions of `__all__` with their signatures,
the submodules it exports, and the layers (nn.Module classes of `layers` or `__all__`) with
their forward signature and kernels' two layer flags. From it come:
  - symbols.json in every built variant (what `kernels describe-api` reads: schema_version 1,
    functions and layers by name, the layers' flags), written by `build` as kernel-builder's
    get_kernel check writes it;
  - the guard, as kernels-community's check-public-api rules it: api/v<version>.json is the
    API of build.toml's version. A name removed or a signature changed needs a version bump;
    a name added does not (a noarch kernel's every variant is rebuilt), but the snapshot
    records it. `python -m rope_bwd_triton api` checks, `api --write` regenerates the
    snapshot (and refuses a breaking change unless the version was bumped).
"""

import inspect
import json
import sys
from pathlib import Path

from . import REPO_ROOT

LAYER_FLAGS = ("has_backward", "can_torch_compile")
SCHEMA_VERSION = 1  # of symbols.json, as kernels 0.19's describe-api reads it


def _is_layer(obj) -> bool:
    from torch import nn

    return isinstance(obj, type) and issubclass(obj, nn.Module)


def _layer(cls) -> dict:
    return {"forward": str(inspect.signature(cls.forward))} | {f: getattr(cls, f, None) for f in LAYER_FLAGS}


def describe(module) -> dict:
    """{"functions": {name: signature}, "layers": {name: {forward, flags}}, "modules": [names]}."""
    functions, layers, modules = {}, {}, []
    for name in sorted(module.__all__):
        obj = getattr(module, name)
        if inspect.ismodule(obj):
            modules.append(name)
        elif _is_layer(obj):
            layers[name] = _layer(obj)
        else:
            functions[name] = str(inspect.signature(obj))
    home = getattr(module, "layers", None)
    for name, obj in sorted(vars(home).items() if inspect.ismodule(home) else ()):
        if not name.startswith("_") and _is_layer(obj) and obj.__module__ == home.__name__:
            layers.setdefault(name, _layer(obj))
    return {"functions": functions, "layers": layers, "modules": modules}


def symbols(description: dict) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "functions": [{"name": name} for name in description["functions"]],
        "layers": [
            {"name": name, "attributes": {f: layer[f] for f in LAYER_FLAGS}}
            for name, layer in description["layers"].items()
        ],
    }


def symbols_json(variant: str) -> str:
    """symbols.json of the variant at `variant`, loaded as kernels loads it (build runs this in a
    fresh process)."""
    import kernels

    return json.dumps(symbols(describe(kernels.get_local_kernel(Path(variant)))), indent=2) + "\n"


def snapshot_path(version: int, root: Path = REPO_ROOT) -> Path:
    return root / "api" / f"v{version}.json"


def _flat(description: dict) -> dict:
    return (
        {f"function {k}": v for k, v in description["functions"].items()}
        | {f"layer {k}": json.dumps(v, sort_keys=True) for k, v in description["layers"].items()}
        | {f"module {k}": "module" for k in description["modules"]}
    )


def compare(old: dict, new: dict) -> dict:
    """{"removed": [...], "changed": [...], "added": [...]} between two descriptions."""
    before, after = _flat(old), _flat(new)
    return {
        "removed": sorted(k for k in before if k not in after),
        "changed": sorted(k for k in before if k in after and before[k] != after[k]),
        "added": sorted(k for k in after if k not in before),
    }


def check(description: dict, version: int, root: Path = REPO_ROOT) -> list[str]:
    """What stands between the package and its snapshot (empty: they agree)."""
    path = snapshot_path(version, root)
    rel = path.relative_to(root)
    if not path.is_file():
        return [f"no snapshot of version {version}'s API: run `python -m rope_bwd_triton api --write` to write {rel}"]
    diff = compare(json.loads(path.read_text()), description)
    problems = [f"{kind} {key}" for kind in ("removed", "changed", "added") for key in diff[kind]]
    if diff["removed"] or diff["changed"]:
        problems.append(
            f"a name removed or changed breaks version {version}: bump [general] version in build.toml, "
            "then run `python -m rope_bwd_triton api --write`"
        )
    elif diff["added"]:
        problems.append("names added (no bump needed for a noarch kernel): run `python -m rope_bwd_triton api --write`")
    return problems


def write(description: dict, version: int, root: Path = REPO_ROOT) -> Path:
    """Write the snapshot of `version`; a breaking change to an existing one is refused."""
    path = snapshot_path(version, root)
    if path.is_file():
        diff = compare(json.loads(path.read_text()), description)
        if diff["removed"] or diff["changed"]:
            from .cli import UsageError

            broken = ", ".join(diff["removed"] + diff["changed"])
            raise UsageError(f"{broken}: a breaking change to version {version}; bump [general] version in build.toml")
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(description, indent=2) + "\n")
    return path


def add_arguments(parser):
    parser.add_argument("--write", action="store_true", help="write api/v<version>.json from the package")


def main(args) -> int:
    from .build import read_config
    from .load import load_kernel

    version = read_config()["general"]["version"]
    description = describe(load_kernel())
    if args.write:
        print(f"wrote {write(description, version).relative_to(REPO_ROOT)}")
        return 0
    problems = check(description, version)
    for line in problems:
        print(f"api: {line}", file=sys.stderr)
    if not problems:
        print(f"api: the package's API is api/v{version}.json's")
    return 1 if problems else 0
