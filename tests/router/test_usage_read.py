"""An OpenAI-shaped usage object read exactly (router/_apis/usage.py): a count given alone is reported with the
other 0, zero is a count, and anything but a non-negative integer is no count. Pinned where mutmut found changes no
test of its selection noticed (issue 23)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router._apis.usage import UsageReader
from router._observe.usage import Tokens


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 5}, Tokens(5, 0, 0, True)),  # one count given: reported, the other 0
        ({"completion_tokens": 3}, Tokens(0, 0, 3, True)),
        ({"prompt_tokens": 0, "completion_tokens": 0}, Tokens(0, 0, 0, True)),  # zero is a count
        ({"prompt_tokens": "12", "completion_tokens": 3}, Tokens(0, 0, 3, True)),  # not a number: no count
        ({"prompt_tokens": -4, "completion_tokens": True}, Tokens(0, 0, 0, False)),  # negative, a boolean: none
        ({}, Tokens(0, 0, 0, False)),
    ],
)  # fmt: skip
def test_an_openai_usage_object_is_read_exactly(usage: dict[str, Any], expected: Tokens) -> None:
    reader = UsageReader("chat")
    reader.body(json.dumps({"usage": usage}).encode())
    assert reader.tokens == expected
