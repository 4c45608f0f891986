"""Wire JSON: orjson when installed, the standard library wherever orjson refuses; event templates that encode the
same bytes as encoding the whole event."""

from __future__ import annotations

import json

import pytest

from hrl.runners.proxy import jsonio
from hrl.runners.proxy.dialects.base import HOLE, SSETemplate, sse


@pytest.mark.parametrize("obj", [{"a": "é\x00\n", "b": [1, None]}, {"big": 1 << 70}, {1: "non-string key"}])
def test_dumps_is_the_same_json_value(obj: object) -> None:
    assert json.loads(jsonio.dumps(obj)) == json.loads(json.dumps(obj))


def test_event_template_fills_to_the_whole_event() -> None:
    data = {"type": "content_block_delta", "index": 3, "seq": HOLE, "delta": {"type": "text_delta", "text": HOLE}}
    template = SSETemplate(data, event="content_block_delta")
    for seq, text in [(0, "plain"), (7, 'quote " back\\slash'), (12, "é 日本 \x00 \n"), (1, "")]:
        whole = sse({**data, "seq": seq, "delta": {"type": "text_delta", "text": text}}, event="content_block_delta")
        assert template.fill(seq, text) == whole
    with pytest.raises(ValueError):
        template.fill("one value for two holes")
