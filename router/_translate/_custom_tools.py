"""A Responses custom tool (Codex's `apply_patch`, free-form input in a grammar) as a chat function tool (issue 30):
most chat servers (vLLM, the chat-only providers) take function tools only and refuse chat's `custom` tools.

    function_tool({"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark",
                   "definition": GRAMMAR}})
    # {"type": "function", "function": {"name": "apply_patch", "parameters": {"type": "object",
    #   "properties": {"input": {"type": "string", "description": "The tool's input, in this lark grammar: ..."}},
    #   "required": ["input"]}}}
    input_of('{"input": "*** Begin Patch..."}')   # "*** Begin Patch...": the call's input again

The model then calls a function with one string argument, `input`, whose description carries the grammar (cut at
`GRAMMAR_CHARS`) so that it knows the format; a call of that function comes back to the client as the
`custom_tool_call` it expects, with that string as its `input`. `InputStream` does so for streamed argument pieces
without holding them: it decodes the JSON string as it comes.
"""

from __future__ import annotations

import json
from typing import Any

from router._translate.base import Body

LOSS = "custom_tool_as_function"  # named per request: the grammar is a description, not a constraint, on the model
GRAMMAR_CHARS = 8000
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEAD = '{"input":"'  # what an argument string starts with (whitespace aside) before the input's own characters
_SPACED = (0, 1, 8, 9)  # where in _HEAD whitespace may come: before `{`, the key, `:` and the value


def function_tool(tool: Body) -> Body:
    """A custom tool (name and description carried) as a function tool taking its input as one string."""
    format_ = tool.get("format")
    about = "The tool's input, free-form text."
    if isinstance(format_, dict) and format_.get("type") == "grammar" and isinstance(format_.get("definition"), str):
        definition = format_["definition"]
        if len(definition) > GRAMMAR_CHARS:
            definition = definition[:GRAMMAR_CHARS] + "\n..."
        about = f"The tool's input, in this {format_.get('syntax') or 'grammar'} grammar:\n{definition}"
    parameters = {
        "type": "object",
        "properties": {"input": {"type": "string", "description": about}},
        "required": ["input"],
    }
    function: Body = {"name": tool.get("name"), "parameters": parameters}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def function_call(call_id: Any, name: Any, text: Any) -> Body:
    """A `custom_tool_call` item's call as a chat function call: its input as the `input` argument."""
    arguments = json.dumps({"input": text if isinstance(text, str) else ""}, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def input_of(arguments: str) -> str:
    """A function call's arguments as the custom call's input: the `input` string, or the arguments as they came
    when they hold none (a model that did not follow the schema: its text is the best guess at the input)."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get("input"), str):
        return _sound(parsed["input"])
    return arguments


def _sound(text: str) -> str:
    """`text` with any lone surrogate (an unpaired `\\ud83d` escape) as `?`: it cannot be sent as UTF-8."""
    return text.encode("utf-8", "replace").decode("utf-8")


class InputStream:
    """A streamed function call's argument pieces as its input's pieces, as they come: the JSON string after
    `{"input":"` is decoded character by character (an escape cut between pieces waits for its end, a few
    characters). Arguments of another shape (another key first, not an object) are held, that one call's only,
    and given whole by `end` as `input_of` reads them."""

    def __init__(self) -> None:
        self.raw: list[str] = []
        self.matched = 0  # how much of _HEAD the arguments have matched so far
        self.held = False  # not the expected shape: held until the end
        self.inside = False  # in the input string
        self.closed = False  # past its closing quote
        self.escape = ""  # an escape begun: "\\", "\\u", "\\u00", ...
        self.high = ""  # a high surrogate waiting for its low half

    def feed(self, piece: str) -> str:
        """The input characters `piece` completes (often all of them; "" while held)."""
        self.raw.append(piece)
        out: list[str] = []
        for char in piece:
            if self.held or self.closed:
                break
            if self.inside:
                out.append(self._char(char))
            elif char in " \t\r\n" and self.matched in _SPACED:  # whitespace between JSON tokens
                continue
            elif char == _HEAD[self.matched]:
                self.matched += 1
                self.inside = self.matched == len(_HEAD)
            else:
                self.held = True
        return "".join(out)

    def _char(self, char: str) -> str:
        if self.escape:
            self.escape += char
            if self.escape[1] != "u":
                self.escape, text = "", _ESCAPES.get(char, char)
                return self._unit(text)
            if len(self.escape) < 6:
                return ""
            code, self.escape = self.escape[2:], ""
            try:
                return self._unit(chr(int(code, 16)))
            except ValueError:
                return self._unit("?")
        if char == "\\":
            self.escape = "\\"
            return ""
        if char == '"':
            self.closed = True
            return self._unit("")
        return self._unit(char)

    def _unit(self, text: str) -> str:
        """A decoded character, a surrogate pair joined (a lone surrogate as `?`)."""
        out = ""
        if self.high:
            if text and "\udc00" <= text <= "\udfff":
                pair, self.high = self.high + text, ""
                return pair.encode("utf-16", "surrogatepass").decode("utf-16")
            out, self.high = "?", ""
        if text and "\ud800" <= text <= "\udbff":
            self.high = text
            return out
        return out + _sound(text)

    def end(self) -> str:
        """What is left at the call's end: the whole input when it was held, else a surrogate left unpaired."""
        if self.held or not self.inside:
            return input_of("".join(self.raw))
        return self._unit("") if self.high else ""
