"""The request's facts (policies/_facts.py) as an adapter read them: sizes, counts, flags, the API.

    facts = request_facts(api, body, state)       # {"request.tokens": 412, "request.stream": False, ...}

Computed from the turns the adapter already parsed for the decision state (every turn, not the state's budget:
a 150,000-token conversation is that long whatever the engine is shown), only for a policy whose rules read facts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from policies import Facts

if TYPE_CHECKING:
    from router._apis.chat import Api
    from router._apis.state import DecisionState

# Measured against Qwen2.5's tokenizer (benchmarks/tokens.py; docs/policies.md#facts gives the figures): English
# prose is 3.7 characters a token, code 4.1, JSON 4.3, Chinese 1.7. A non-ASCII character is 1 to 3 UTF-8 bytes
# more than one; counting 0.175 tokens a byte extra makes a CJK character 0.6 tokens and leaves ASCII at chars/4.
CHARS_PER_TOKEN = 4.0
TOKENS_PER_EXTRA_BYTE = 0.175
TOKENS_PER_TURN = 4  # the chat template's role markers around each turn


def estimate_tokens(text: str, turns: int = 0) -> int:
    """The tokens `text` (spread over `turns` turns) takes, estimated without a tokenizer. Against Qwen2.5's count
    (benchmarks/results/tokens.md): English prose 8% under, code 2% over, JSON 7% over, Chinese 1% over; one file
    17% under (regex-dense code); further off on unusual text (long digit runs, emoji, base64).

    >>> estimate_tokens("Hello world, this is a test of the tokenizer.")
    12
    """
    chars = len(text)
    extra = 0 if text.isascii() else len(text.encode("utf-8", "surrogatepass")) - chars
    return math.ceil(chars / CHARS_PER_TOKEN + extra * TOKENS_PER_EXTRA_BYTE) + TOKENS_PER_TURN * turns


def request_facts(api: Api, body: Mapping[str, Any], state: DecisionState) -> dict[str, Any]:
    """The `request.*` and `session.*` facts of a request `api` parsed into `state` (its turns)."""
    turns = state.turns
    texts = [turn.shown for turn in turns]
    text = "\n".join(texts)
    images = videos = users = answered = 0
    for turn in turns:
        users += turn.role == "user"
        answered += turn.role == "assistant"
        for kind, _ in turn.media:
            if kind == "image":
                images += 1
            else:
                videos += 1
    return {
        "request.tokens": estimate_tokens(text, len(turns)),
        "request.chars": len(text) - max(len(texts) - 1, 0),  # the turns' own characters, not the joins
        "request.turns": users,
        "request.tools": api.tools(body),
        "request.images": images,
        "request.videos": videos,
        "request.stream": body.get("stream") is True,
        "request.api": api.name,
        "session.turns": answered,
    }


def caller_facts(name: str | None, group: str | None) -> Facts:
    """The `caller.*` facts: the client key's name and group, empty strings without keys; `budget.used` 0 (the
    proxy reads the caller's budgets, router/_faces/budgets.py)."""
    return {"caller.name": name or "", "caller.group": group or "", "budget.used": 0.0}
