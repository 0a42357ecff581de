"""`python -m rope_bwd_triton results`: the figures the repository states, written from the
release records, never by hand.

A release run (`bash scripts/gpu.sh release` on a GPU machine) leaves one folder per GPU,
unpacked into benchmarks/<gpu>/: release.json (its tests and the versions), and the bench
records bench (the suite preset), realcall, decoder, decode and families, with their -untuned twins where
the GPU has a tuned table. From those files this command writes
    - RESULTS.md's section of each GPU, between `<!-- results:<gpu>:start -->` and its end marker;
    - the README's performance table, between `<!-- performance:start -->` and its end marker,
      one column per GPU, and CARD.md after it (publish.py: the card is the README's part).
A figure from a record of another commit than its GPU's release names that commit.

--check writes nothing: exit status 1 where a file is not what the records give.
--release DIR (on the GPU machine, scripts/gpu.sh): the release's summary, DIR/release.json,
and one line; exit status 1 unless every test passed and every record was written.
"""

import argparse
import json
import re
import sys
from pathlib import Path

from . import REPO_ROOT, cli, output

BENCHMARKS = REPO_ROOT / "benchmarks"
RECORDS = ("bench", "realcall", "decoder", "decode", "families")
COUNTS = ("passed", "failed", "errors", "skipped")


def add_arguments(parser):
    parser.add_argument("--check", action="store_true", help="exit 1 where RESULTS.md or the README is out of date")
    parser.add_argument("--release", type=Path, help="the GPU machine's release folder: write its release.json")
    parser.add_argument("--tests", nargs=2, metavar=("LOG", "STATUS"), help="--release: the tests' log, exit status")
    parser.add_argument("--big", nargs=2, metavar=("LOG", "STATUS"), help="--release: the whole_gpu tests'")
    parser.add_argument("--seconds", type=cli.nonnegative_int, help="--release: the run's seconds so far")
    parser.add_argument("--records", type=cli.nonnegative_int, help="--release: how many records it ran")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)  # the tests' copies


# The release summary, on the GPU machine


def pytest_counts(log: Path, status: int) -> dict:
    """The counts of pytest's last summary line in `log` ({} where the run was cut short), and
    its exit status (124: stopped at its deadline)."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    lines = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|errors?|skipped)\b", line)]
    counts = {"exit": status}
    if lines:
        for n, what in re.findall(r"(\d+) (passed|failed|errors?|skipped)\b", lines[-1]):
            counts[what if what != "error" else "errors"] = int(n)
    return counts


def _said(counts: dict) -> str:
    if not any(k in counts for k in COUNTS):
        return "cut short" if counts["exit"] in (124, 137) else f"no summary (exit {counts['exit']})"
    return ", ".join(f"{counts.get(k, 0)} {k}" for k in COUNTS if k != "errors" or counts.get(k))


def release_summary(folder: Path, tests, big, seconds: int, expected: int) -> tuple[dict, bool]:
    """release.json's content, and whether the release holds: every test passed (exit 0, which
    tests/skips.py refuses where a skip is not allowed) and every record was written."""
    import torch

    tests, big = pytest_counts(Path(tests[0]), int(tests[1])), pytest_counts(Path(big[0]), int(big[1]))
    written = sorted(p.stem for p in folder.glob("*.json") if p.name != "release.json")
    props = torch.cuda.get_device_properties(0)
    summary = {"commit": output.commit(), "gpu": props.name, "sm_count": props.multi_processor_count,
               "l2_bytes": props.L2_cache_size, "versions": output.versions(), "seconds": seconds,
               "tests": tests, "whole_gpu_tests": big, "records": written, "records_run": expected}  # fmt: skip
    ok = tests["exit"] == 0 == big["exit"] and len(written) == expected and tests.get("passed", 0) > 0
    return summary, ok


def release_line(s: dict) -> str:
    return (
        f"release of {s['commit']} on {s['gpu']}: tests {_said(s['tests'])}; whole_gpu tests "
        f"{_said(s['whole_gpu_tests'])}; records {len(s['records'])} of {s['records_run']} written; {s['seconds']} s"
    )


# The records, read back


def record_commit(meta: dict) -> str | None:
    """The commit a record names (records from before run_meta recorded it name none: their
    kernel variant's name is no guide, a GPU machine's copy of a checkout lacks its git history)."""
    return meta.get("commit")


def _at(meta: dict, release: str | None) -> str:
    """How a figure from this record is marked: nothing where it is of the GPU's release."""
    commit = record_commit(meta)
    if release and commit == release:
        return ""
    return f" (at {commit})" if commit else " (commit not recorded)"


def load(folder: Path) -> dict:
    """The release files of one GPU's folder, by name (bench, realcall-untuned, release, ...)."""
    names = [*RECORDS, *(f"{n}-untuned" for n in RECORDS), "release"]
    return {n: json.loads((folder / f"{n}.json").read_text()) for n in names if (folder / f"{n}.json").is_file()}


def release_commit(records: dict) -> str | None:
    return records["release"]["commit"] if "release" in records else None


def _us(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _realcall_us(run: dict, peer: str, figure="mean_us", **where) -> float | None:
    for w in run["workloads"]:
        if all(w.get(k) == v for k, v in where.items()):
            result = w["results"].get(peer)
            if result and "time" in result:
                return result.get(figure) or result["time"].get(figure)
    return None


def _cell(ours, peers) -> str:
    """'ours us; peer x, ...' (the peers measured)."""
    if ours is None:
        return None
    rest = [f"{label} {_us(t)}" for label, t in peers if t is not None]
    return f"{_us(ours)} us" + ("; " + ", ".join(rest) if rest else "")


# The README's rows: (label, record, figure of one GPU's run)
def _suite_row(run):
    impls = run.get("summary", {}).get("impls", {})
    get = lambda name: impls.get(name, {}).get("mean_us")
    return _cell(get("ours_bwd"), [("copy", get("copy_bwd")), ("torch.compile", get("compiled_bwd")),
                                   ("eager", get("eager_bwd"))])  # fmt: skip


def _call_row(peers, figure="mean_us", **where):
    def row(run):
        ours = _realcall_us(run, "ours", figure, **where)
        return _cell(ours, [(label, _realcall_us(run, p, figure, **where)) for p, label in peers])

    return row


ROWS = [
    ("SOL-ExecBench 019, fp32 backward, mean of the 16 workloads", "bench", _suite_row),
    ("Qwen3-Omni vision call, bf16 16 x 72, sdpa's gradient, S = 4096", "realcall",
     _call_row([("copy", "two copies"), ("compile", "torch.compile"), ("liger", "Liger")], D=72, layout="sdpa",
               S=4096, dtype="bfloat16")),
    ("Llama-3-8B decoder call, bf16, B = 1, S = 8192", "decoder",
     _call_row([("copy", "two copies"), ("compile", "torch.compile"), ("liger", "Liger"), ("transformers", "eager")],
               model="llama3-8b", B=1, S=8192)),
    ("Decode step (Llama-3-8B heads, forward, B = 1, S = 1), wall time per call", "decode",
     _call_row([("compile", "torch.compile"), ("transformers", "eager")], "wall_us", model="llama3-8b", B=1, S=1)),
]  # fmt: skip


def performance_table(gpus: dict) -> str:
    """The README's table: a row per workload, a column per GPU; a figure from another commit
    than its GPU's release names it."""
    header = ["workload"]
    for gpu, records in gpus.items():
        name = next((r["meta"]["gpu"] for r in records.values() if "meta" in r), gpu.upper())
        release = records.get("release")
        whole = release and release["tests"].get("exit") == 0 and len(release["records"]) == release["records_run"]
        header.append(
            name + (f" ({'release' if whole else 'release run cut short'} {release['commit']})" if release else "")
        )
    rows = []
    for label, record, figure in ROWS:
        row = [label]
        for records in gpus.values():
            run = records.get(record)
            cell = figure(run) if run else None
            if cell:
                cell += _at(run["meta"], release_commit(records))
            row.append(cell or "not measured yet")
        rows.append(row)
    return output.markdown_table(header, rows)


def _versions(meta: dict) -> str:
    v = output.recorded_versions(meta)
    return ", ".join(f"{k} {v[k]}" for k in ("torch", "triton", "kernels", "transformers", "liger-kernel") if v.get(k))


def _table(gpu_name: str) -> str:
    """Which launch configurations the package takes on this GPU (tuning.py's file name)."""
    table = gpu_name.replace(" ", "_").replace("/", "_") + ".json"
    if (REPO_ROOT / "torch-ext" / "rope_bwd" / "configs" / table).is_file():
        return f"Tuned table: `configs/{table}` (the `-untuned` records: default_config)."
    return "No tuned table ships for it: every figure is default_config's."


def gpu_section(gpu: str, records: dict, rel: str) -> str:
    """RESULTS.md's section of one GPU, from its folder's records (`rel`: the folder from RESULTS.md)."""
    from . import realcall, report

    commit = release_commit(records)
    some = records.get("release") or next((r.get("meta", r) for r in records.values()), {})  # the release's versions
    name = some.get("gpu") or gpu.upper()
    lines = [f"## {name}", ""]
    if "sm_count" in some:
        lines += [f"{some['sm_count']} SMs, {some['l2_bytes'] / 2**20:.0f} MiB L2. Release: "
                  f"{commit or 'none yet'}; {_versions(some)}. Raw: `{rel}/`. {_table(name)}", ""]  # fmt: skip
    release = records.get("release")
    lines += ["### GPU tests", ""]
    if release:
        lines += [release_line(release) + ".", ""]
    else:
        lines += ["No release run on this GPU yet: `ROPE_COMMIT=<hash> bash scripts/gpu.sh release`.", ""]
    titles = {"bench": "The suite: SOL-ExecBench 019's workloads", "realcall": "The real call (vision encoders)",
              "decoder": "The decoders' call", "decode": "The decode step",
              "families": "GPT-OSS's, DeepSeek-V4's and DINOv3's own calls"}  # fmt: skip
    for record, title in titles.items():
        for suffix, how in (("", ""), ("-untuned", ", default_config (--untuned)")):
            run = records.get(record + suffix)
            if not run:
                continue
            lines += [f"### {title}{how}", "", f"Raw: `{rel}/{record}{suffix}.json`{_at(run['meta'], commit)}.", ""]
            if record == "bench":
                table = report._suite_table(run)[2:]  # without its heading
                lines += [f"Command: `{run['meta']['command']}`; {run['meta']['date']}.", "", *table]
            else:
                lines += [realcall.render_markdown([run])]
        if not records.get(record):
            lines += [f"### {title}", "", "Not measured yet on this GPU.", ""]
    return "\n".join(lines).rstrip() + "\n"


def replace_between(text: str, name: str, body: str, where: str) -> str:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if text.count(start) != 1 or text.count(end) != 1:
        raise cli.UsageError(f"{where} needs one {start} and one {end}")
    head, rest = text.split(start)
    return head + start + "\n" + body.rstrip() + "\n" + end + rest.split(end)[1]


def rendered(root: Path) -> dict:
    """{path: the text it should hold} for RESULTS.md, README.md and CARD.md."""
    from . import publish

    gpus = {p.name: load(p) for p in sorted((root / "benchmarks").iterdir()) if p.is_dir() and load(p)}
    results_path, readme_path = root / "benchmarks" / "RESULTS.md", root / "README.md"
    results = results_path.read_text()
    for gpu, records in gpus.items():
        results = replace_between(results, f"results:{gpu}", gpu_section(gpu, records, gpu), "RESULTS.md")
    readme = replace_between(readme_path.read_text(), "performance", performance_table(gpus), "README.md")
    return {results_path: results, readme_path: readme, root / publish.CARD.name: publish.render_card(readme)}


def main(args) -> int:
    if args.release:
        if not (args.tests and args.big and args.seconds is not None and args.records is not None):
            raise cli.UsageError("--release needs --tests, --big, --seconds and --records")
        summary, ok = release_summary(args.release, args.tests, args.big, args.seconds, args.records)
        (args.release / "release.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(release_line(summary) + ("" if ok else ": NOT A RELEASE"))
        return 0 if ok else 1
    stale = []
    for path, text in rendered(args.root).items():
        if path.read_text() != text:
            stale.append(path.name)
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        print(f"results: {', '.join(stale)} out of date; run `python -m rope_bwd_triton results`", file=sys.stderr)
        return 1
    print(f"results: {', '.join(stale) or 'nothing'} {'to write' if args.check else 'written'}")
    return 0
