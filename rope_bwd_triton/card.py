"""`python -m rope_bwd_triton card`: the Hub card (CARD.md, the README.md of the Hub
repository's main branch) from README.md's card part, so that the facts both state have one
source: README.md between `<!-- card:start -->` and `<!-- card:end -->`, under the card's
front matter (library_name: kernels, which the Hub's kernels listing reads)."""

import sys

from . import REPO_ROOT, cli

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


def render(readme: str) -> str:
    try:
        body = readme.split(START, 1)[1].split(END, 1)[0]
    except IndexError:
        raise cli.UsageError(f"README.md has no part between {START} and {END}") from None
    return f"{FRONT_MATTER}\n# rope-bwd\n\n{body.strip()}\n"


def add_arguments(parser):
    parser.add_argument("--check", action="store_true", help="exit 1 if CARD.md is not README.md's card part")


def main(args) -> int:
    card = render((REPO_ROOT / "README.md").read_text())
    path = REPO_ROOT / "CARD.md"
    if args.check:
        if path.read_text() != card:
            print("card: CARD.md is out of date; run `python -m rope_bwd_triton card`", file=sys.stderr)
            return 1
        return 0
    path.write_text(card)
    print(f"wrote {path}")
    return 0
