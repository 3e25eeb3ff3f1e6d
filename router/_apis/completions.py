"""The legacy Completions API adapter: `prompt` instead of `messages`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router._apis.chat import Api
from router._apis.content import Content, kind_of, need_str
from router._apis.state import Turn
from router._errors import BadRequest


class Completions(Api):
    """The legacy Completions API: `prompt` is a string or a list of strings (token ids cannot be read)."""

    name = "completions"
    path = "/v1/completions"
    upstream_path = "/completions"

    def turns(self, body: Mapping[str, Any], content: Content) -> list[Turn]:
        prompt = body.get("prompt")
        if prompt is None:
            raise BadRequest("`prompt` is missing; expected a string or a list of strings", "prompt")
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, list):
            raise BadRequest(f"`prompt` must be a string or a list of strings, found {kind_of(prompt)}", "prompt")
        if not prompts:
            raise BadRequest("`prompt` is empty; expected a string or at least one string", "prompt")
        texts = []
        for index, item in enumerate(prompts):
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, int | list) and not isinstance(item, bool):
                content.unreadable("token ids", "prompt" if isinstance(item, int) else f"prompt[{index}]")
            else:
                raise BadRequest(f"prompt[{index}] must be a string, found {kind_of(item)}", f"prompt[{index}]")
        suffix = body.get("suffix")
        if suffix is not None:
            texts.append(need_str(suffix, "suffix"))
        return [Turn("user", "\n\n".join(texts))]


COMPLETIONS = Completions()
