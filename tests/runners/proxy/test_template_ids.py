"""`ChatTemplate.encode` goes straight to the Rust tokenizer: it must give exactly the ids the transformers wrapper
gives, for every family's tokenizer and any text, special tokens and odd Unicode included (a drift here would put
ids in a trace that the model was never shown)."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hrl.runners.proxy.template import ChatTemplate
from hrl.train.tiny.families import FAMILIES


@cache
def _template(path: str) -> ChatTemplate:
    return ChatTemplate(path)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_encode_matches_the_transformers_tokenizer(family, family_model) -> None:
    tmpl = _template(family_model(family))
    specials = sorted(tmpl.tokenizer.all_special_tokens) + list(tmpl.tokenizer.get_added_vocab())
    piece = st.one_of(st.text(max_size=40), st.sampled_from(specials), st.sampled_from([" ", "\n", "\t", "  \n"]))

    @settings(max_examples=150, deadline=None)
    @given(st.lists(piece, max_size=12))
    def check(pieces: list[str]) -> None:
        text = "".join(pieces)
        assert tmpl.encode(text) == list(tmpl.tokenizer.encode(text, add_special_tokens=False))

    check()
    rendered = tmpl.render([{"role": "user", "content": "fix the bug"}, {"role": "assistant", "content": "done"},
                            {"role": "user", "content": "again"}])  # fmt: skip
    assert tmpl.encode(rendered) == list(tmpl.tokenizer.encode(rendered, add_special_tokens=False))
