"""End to end through translated routes (issue 30, done-when): `d3router serve` on loopback, a real vLLM deciding and
answering, addressed only through its Chat Completions API (`api: chat`) by the `openai` SDK's Responses API, and
only through its Responses API (`api: responses`) by the SDK's chat API. The real model's function call (forced by
a named tool choice, which vLLM fills under a grammar) comes back as a Responses `function_call`, and its output goes
back to the model as a chat `tool` message."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from d3backend import VllmServer
from tests.conftest import SERVED_MODEL, require_vllm, running
from tests.router._peers import served_openai, serving_router

pytestmark = pytest.mark.engine

# Tool calls need a tool parser; `pythonic` asks nothing of the tiny model's tokenizer. Without free whitespace the
# grammar ends the forced call's JSON at once, so the call is whole within a few tokens.
TOOL_ARGS = ["--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
             "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}']  # fmt: skip
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "strict": False,
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                          "required": ["city"], "additionalProperties": False}}  # fmt: skip


@pytest.fixture(scope="module")
def tool_vllm(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    require_vllm()
    yield from running(VllmServer(tiny_model, served_model_name=SERVED_MODEL,
                                  workdir=tmp_path_factory.mktemp("vllm-tools"), extra_args=TOOL_ARGS))  # fmt: skip


@pytest.fixture(scope="module")
def router_url(tool_vllm: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = tmp_path_factory.mktemp("e2e-translate") / "router.yaml"
    text = f"""
server: {{expose_decisions: true}}
engine:
  remote: {{urls: ["{tool_vllm.url}"], model: {SERVED_MODEL}, timeout_s: 10}}
upstreams:
  chatonly: {{url: "{tool_vllm.url}/v1", model: {SERVED_MODEL}, api: chat}}
  responsesonly: {{url: "{tool_vllm.url}/v1", model: {SERVED_MODEL}, api: responses}}
policies:
  tochat:
    apis: [responses]
    questions: {{kind: {{type: choice, criteria: {{code: Writing code, chat: Anything else}}}}}}
    rules:
      - {{name: any-kind, when: kind.code >= 0, route: chatonly}}
      - {{name: default, route: chatonly}}
  toresponses:
    apis: [chat]
    questions: {{kind: {{type: choice, criteria: {{code: Writing code, chat: Anything else}}}}}}
    rules:
      - {{name: any-kind, when: kind.code >= 0, route: responsesonly}}
      - {{name: default, route: responsesonly}}
"""
    with serving_router(config, text) as url:
        yield url


sdk = served_openai()


def test_the_responses_api_calls_a_function_and_reads_its_output_through_chat(sdk: openai.OpenAI) -> None:
    asked: list[dict[str, object]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    raw = sdk.responses.with_raw_response.create(
        model="tochat", instructions="Use the tool.", input=asked, tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=32, store=False,
    )  # fmt: skip
    first = raw.parse()
    assert (raw.headers["x-d3-rule"], raw.headers["x-d3-upstream"]) == ("any-kind", "chatonly")
    assert first.object == "response" and first.model == "tochat" and first.status == "completed"
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "Rome")
    assert first.usage is not None and first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    result = [*asked, calls[0].model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}]  # fmt: skip
    second = sdk.responses.create(model="tochat", input=result, tools=[WEATHER], max_output_tokens=8)  # type: ignore[arg-type,list-item]
    assert second.status in ("completed", "incomplete") and second.model == "tochat"
    assert second.output and all(item.type in ("message", "function_call") for item in second.output)
    assert second.usage is not None and second.usage.input_tokens > first.usage.input_tokens  # the output was read


def test_the_responses_api_streams_a_function_call_through_chat(sdk: openai.OpenAI) -> None:
    with sdk.responses.stream(
        model="tochat", input="Weather in Rome?", tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=32,
    ) as stream:  # fmt: skip
        kinds = [event.type for event in stream]
        final = stream.get_final_response()  # the SDK's accumulator checked every event's ids and order
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    call = next(item for item in final.output if item.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Rome")
    assert final.usage is not None and final.usage.output_tokens > 0  # from the usage chunk the router asked for
    with sdk.responses.stream(model="tochat", input="Say something.", max_output_tokens=8) as stream:
        events = list(stream)
    assert events[-1].type in ("response.completed", "response.incomplete")
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text and events[-1].response.output_text == text  # type: ignore[union-attr]


def test_the_chat_api_through_a_responses_only_upstream(sdk: openai.OpenAI) -> None:
    raw = sdk.chat.completions.with_raw_response.create(
        model="toresponses", max_tokens=8, stop=["\n"],
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}],
    )  # fmt: skip
    answer = raw.parse()
    assert (raw.headers["x-d3-upstream"], raw.headers["x-d3-translation-losses"]) == ("responsesonly", "stop_dropped")
    assert answer.object == "chat.completion" and answer.model == "toresponses"
    assert answer.choices[0].finish_reason in ("length", "stop") and answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens <= 8
    stream = sdk.chat.completions.create(model="toresponses", max_tokens=8, stream=True,
                                         stream_options={"include_usage": True},
                                         messages=[{"role": "user", "content": "Say something."}])  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")
    assert chunks[-1].usage is not None and 0 < chunks[-1].usage.completion_tokens <= 8


PATCH_TOOL = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
              "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'}}  # fmt: skip


def test_a_custom_tool_reaches_vllm_as_a_function_and_comes_back_a_custom_call(sdk: openai.OpenAI) -> None:
    """Codex's `apply_patch` is a custom tool, which vLLM's chat server refuses: it goes as a function taking its
    `input`, which vLLM fills under the forced choice's schema, and the streamed call comes back a `custom_tool_call`
    (its input decoded as it comes)."""
    with sdk.responses.stream(
        model="tochat", input="Add a file hello.txt saying hi.", tools=[PATCH_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "custom", "name": "apply_patch"}, max_output_tokens=48,
    ) as stream:  # fmt: skip
        events = list(stream)  # the SDK's accumulator checked every event's ids and order
    final = events[-1].response  # type: ignore[union-attr]  # incomplete when the tiny model runs to the limit
    kinds = [event.type for event in events]
    assert (
        kinds[-1] in ("response.completed", "response.incomplete") and "response.custom_tool_call_input.done" in kinds
    )
    call = next(item for item in final.output if item.type == "custom_tool_call")
    deltas = "".join(event.delta for event in events if event.type == "response.custom_tool_call_input.delta")
    assert call.name == "apply_patch" and call.call_id and deltas == call.input
    raw = sdk.responses.with_raw_response.create(
        model="tochat", input="Add a file hello.txt saying hi.", tools=[PATCH_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "custom", "name": "apply_patch"}, max_output_tokens=48,
    )  # fmt: skip
    assert "custom_tool_as_function" in raw.headers["x-d3-translation-losses"]
    assert [item.type for item in raw.parse().output if item.type != "reasoning"][-1] == "custom_tool_call"
