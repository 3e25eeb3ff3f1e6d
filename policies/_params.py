"""What a rule's `set` means in each client API.

A rule sets parameters by their Chat Completions names; each API's body spells some of them differently, and some
have no equivalent at all:

    >>> param_path("responses", "max_tokens")
    ('max_output_tokens',)
    >>> param_path("responses", "reasoning_effort")
    ('reasoning', 'effort')
    >>> param_path("messages", "reasoning_effort") is None
    True
    >>> param_path("messages", "top_k")          # a name outside the table goes as it is written
    ('top_k',)

`d3router check` refuses a policy whose rule sets a parameter that one of the policy's `apis` cannot take, so
nothing is dropped silently at request time.
"""

from __future__ import annotations

from typing import Literal

ApiName = Literal["chat", "completions", "responses", "messages"]
APIS: tuple[ApiName, ...] = ("chat", "completions", "responses", "messages")
API_TITLES: dict[str, str] = {
    "chat": "Chat Completions (/v1/chat/completions)",
    "completions": "Completions (/v1/completions)",
    "responses": "Responses (/v1/responses)",
    "messages": "Anthropic Messages (/v1/messages)",
}

_SAME = ("chat", "completions", "responses", "messages")

# name -> per API: the key path in that API's body, or None where the API has no such parameter.
PARAMS: dict[str, dict[str, tuple[str, ...] | None]] = {
    "temperature": {api: ("temperature",) for api in _SAME},
    "top_p": {api: ("top_p",) for api in _SAME},
    "max_tokens": {
        "chat": ("max_tokens",),
        "completions": ("max_tokens",),
        "responses": ("max_output_tokens",),
        "messages": ("max_tokens",),
    },
    "max_completion_tokens": {
        "chat": ("max_completion_tokens",),
        "completions": ("max_tokens",),
        "responses": ("max_output_tokens",),
        "messages": ("max_tokens",),
    },
    "reasoning_effort": {
        "chat": ("reasoning_effort",),
        "completions": None,
        "responses": ("reasoning", "effort"),
        "messages": None,
    },
    "stop": {"chat": ("stop",), "completions": ("stop",), "responses": None, "messages": ("stop_sequences",)},
    "seed": {"chat": ("seed",), "completions": ("seed",), "responses": None, "messages": None},
    "frequency_penalty": {
        "chat": ("frequency_penalty",),
        "completions": ("frequency_penalty",),
        "responses": None,
        "messages": None,
    },
    "presence_penalty": {
        "chat": ("presence_penalty",),
        "completions": ("presence_penalty",),
        "responses": None,
        "messages": None,
    },
    "parallel_tool_calls": {
        "chat": ("parallel_tool_calls",),
        "completions": None,
        "responses": ("parallel_tool_calls",),
        "messages": None,
    },
    "service_tier": {
        "chat": ("service_tier",),
        "completions": None,
        "responses": ("service_tier",),
        "messages": ("service_tier",),
    },
}

# Keys that carry the request itself, in any API: a rule routes and tags, it does not rewrite what was asked.
STRUCTURAL = frozenset({"model", "messages", "stream", "prompt", "input", "instructions", "system", "suffix"})


# The (client, upstream) API pairs router/_translate registers (tests/router/test_translate_messages_chat.py checks
# the two agree); a pair not listed is composed through chat where both halves are (X -> chat -> Y).
TRANSLATIONS: frozenset[tuple[str, str]] = frozenset(
    {("messages", "chat"), ("chat", "messages"), ("responses", "chat"), ("chat", "responses")}
)


def translatable(client: str, upstream: str | None) -> bool:
    """Whether a request of the `client` API can go to an upstream speaking `upstream` (None: the client's own)."""
    if upstream is None or client == upstream or (client, upstream) in TRANSLATIONS:
        return True
    return (client, "chat") in TRANSLATIONS and ("chat", upstream) in TRANSLATIONS


def param_path(api: str, name: str) -> tuple[str, ...] | None:
    """Where `api`'s body takes the parameter `name`, or None when it has no equivalent."""
    spelled = PARAMS.get(name)
    if spelled is None:
        return (name,)
    return spelled[api]
