"""CARD.md (the Hub page) is README.md's card part under the card's front matter: one source
for the facts both state."""

import pytest

from rope_bwd_triton import REPO_ROOT, card, cli


def test_card_is_readmes_card_part():
    readme = (REPO_ROOT / "README.md").read_text()
    assert (REPO_ROOT / "CARD.md").read_text() == card.render(readme)
    body = readme.split(card.START)[1].split(card.END)[0]
    assert 'get_kernel("rope-bwd/rope-bwd", version=1' in body and "## Performance" in body
    assert "](" not in body.replace("](https://", ""), "a relative link would break on the Hub page"


def test_render_needs_the_markers():
    with pytest.raises(cli.UsageError, match="card:start"):
        card.render("# no card part\n")
