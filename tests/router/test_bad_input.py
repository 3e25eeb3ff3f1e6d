"""A corpus of bad requests: each gets an OpenAI-shaped 4xx with a clear message (or passes through where that is
right), never a 500 and never a crash. Plus property tests: random input never breaks extraction, evaluation or
loading."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from d3backend import Choice, ChoiceAnswer, FakeEngine, Noul, NoulAnswer, Score, ScoreAnswer
from policies import ConfigError, StateSettings, parse_config
from router import BadChatRequest, MediaRules, ProxyApp, create_app, extract_state

pytestmark = pytest.mark.anyio

CONFIG = """
server: {max_body_bytes: 65536, media_hosts: [img.example.com]}
upstreams:
  small: {url: http://small.test/v1, model: small-model}
policies:
  auto:
    state: {max_chars: 200}
    questions: {jailbreak: {type: noul}}
    rules:
      - {name: guard, when: jailbreak > 0.9, block: {status: 403, message: Refused.}}
      - {name: default, route: small, tag: {x-team: a}}
"""
PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()


def msgs(content: Any, role: str = "user") -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": role, "content": content}]}


def part(kind: str, url: Any) -> dict[str, Any]:
    return {"type": kind, kind: {"url": url}}


# (id, raw body or JSON value, content type, expected status, a piece of the expected message or None for 200)
CASES: list[tuple[str, Any, str, int, str | None]] = [
    ("not-json", b"hello", "application/json", 400, "not a JSON object: invalid JSON"),
    ("truncated-json", b'{"model": "auto", "messages": [', "application/json", 400, "invalid JSON"),
    ("trailing-garbage", b'{"model": "auto"} x', "application/json", 400, "invalid JSON"),
    ("empty-body", b"", "application/json", 400, "invalid JSON"),
    ("invalid-utf8", b'{"model": "\xc3\x28"}', "application/json", 400, "invalid UTF-8"),
    ("utf16-bom", "\ufeff{}".encode("utf-16"), "application/json", 400, None),
    ("json-array", [1, 2, 3], "application/json", 400, "must be a JSON object"),
    ("json-string", "auto", "application/json", 400, "must be a JSON object"),
    ("json-number", 42, "application/json", 400, "must be a JSON object"),
    ("json-null", None, "application/json", 400, "must be a JSON object"),
    ("deep-nesting", b"[" * 30_000 + b"]" * 30_000, "application/json", 400, "invalid JSON"),
    ("deep-object", ('{"a":' * 10_000 + "1" + "}" * 10_000).encode(), "application/json", 400, "invalid JSON"),
    ("form-content-type", b"model=auto", "application/x-www-form-urlencoded", 415, "expected content-type"),
    ("text-content-type", b'{"model": "auto"}', "text/plain", 415, "expected content-type"),
    ("multipart", b"--x--", "multipart/form-data; boundary=x", 415, "expected content-type"),
    (
        "over-size-limit",
        {"model": "auto", "pad": "x" * 70_000, "messages": []},
        "application/json",
        413,
        "over 65536 bytes",
    ),
    ("messages-missing", {"model": "auto"}, "application/json", 400, "`messages` is missing"),
    ("messages-null", {"model": "auto", "messages": None}, "application/json", 400, "`messages` is missing"),
    ("messages-empty", {"model": "auto", "messages": []}, "application/json", 400, "`messages` is empty"),
    ("messages-string", {"model": "auto", "messages": "hi"}, "application/json", 400, "must be a list"),
    ("messages-object", {"model": "auto", "messages": {"role": "user"}}, "application/json", 400, "must be a list"),
    ("messages-number", {"model": "auto", "messages": 3}, "application/json", 400, "must be a list"),
    ("message-string", {"model": "auto", "messages": ["hi"]}, "application/json", 400, "messages[0] must be an object"),
    ("message-list", {"model": "auto", "messages": [["user", "hi"]]}, "application/json", 400, "must be an object"),
    ("message-null", {"model": "auto", "messages": [None]}, "application/json", 400, "must be an object"),
    (
        "role-missing",
        {"model": "auto", "messages": [{"content": "hi"}]},
        "application/json",
        400,
        "role must be one of",
    ),
    ("role-unknown", msgs("hi", role="admin"), "application/json", 400, "role must be one of"),
    ("role-number", msgs("hi", role=1), "application/json", 400, "role must be one of"),
    ("content-number", msgs(42), "application/json", 400, "content must be a string or a list"),
    ("content-bool", msgs(True), "application/json", 400, "content must be a string or a list"),
    ("content-object", msgs({"text": "hi"}), "application/json", 400, "content must be a string or a list"),
    ("part-string", msgs(["hi"]), "application/json", 400, "must be an object with a `type`"),
    ("part-no-type", msgs([{"text": "hi"}]), "application/json", 400, "must be an object with a `type`"),
    ("part-type-number", msgs([{"type": 1}]), "application/json", 400, "must be an object with a `type`"),
    ("text-part-number", msgs([{"type": "text", "text": 5}]), "application/json", 400, "text must be a string"),
    ("text-part-missing", msgs([{"type": "text"}]), "application/json", 400, "text must be a string"),
    ("model-missing", {"messages": [{"role": "user", "content": "hi"}]}, "application/json", 404, "does not exist"),
    ("model-number", {"model": 7, "messages": []}, "application/json", 404, "does not exist"),
    ("model-unknown", {"model": "gpt-9", "messages": []}, "application/json", 404, "does not exist"),
    ("model-empty", {"model": "", "messages": []}, "application/json", 404, "does not exist"),
    ("model-with-newline", {"model": "auto\r\nx-evil: 1", "messages": []}, "application/json", 404, "does not exist"),
    ("model-very-long", {"model": "m" * 10_000, "messages": []}, "application/json", 404, "does not exist"),
    ("model-unicode", {"model": "модель", "messages": []}, "application/json", 404, "does not exist"),
    # Accepted, with the state budgeted or media dropped and said so:
    ("far-over-state-budget", msgs("x" * 50_000), "application/json", 200, None),
    (
        "ten-thousand-messages",
        {"model": "auto", "messages": [{"role": "user", "content": f"m{i}"} for i in range(10_000)][:10_000]},
        "application/json",
        413,
        "over 65536 bytes",
    ),
    (
        "thousand-messages",
        {"model": "auto", "messages": [{"role": "user", "content": "m"} for _ in range(1_000)]},
        "application/json",
        200,
        None,
    ),
    (
        "null-content",
        msgs(None, role="assistant") | {"messages": [{"role": "assistant", "content": None}]},
        "application/json",
        200,
        None,
    ),
    ("data-url-image", msgs([{"type": "text", "text": "see"}, part("image_url", PNG)]), "application/json", 200, None),
    ("malformed-data-url", msgs([part("image_url", "data:image/png;base64")]), "application/json", 200, None),
    ("data-url-wrong-mime", msgs([part("image_url", "data:text/html;base64,PGI+")]), "application/json", 200, None),
    ("file-url", msgs([part("image_url", "file:///etc/passwd")]), "application/json", 200, None),
    ("ftp-url", msgs([part("image_url", "ftp://example.com/a.png")]), "application/json", 200, None),
    ("javascript-url", msgs([part("image_url", "javascript:alert(1)")]), "application/json", 200, None),
    (
        "metadata-host",
        msgs([part("image_url", "http://169.254.169.254/latest/meta-data")]),
        "application/json",
        200,
        None,
    ),
    ("host-not-allowed", msgs([part("image_url", "https://evil.example.com/a.png")]), "application/json", 200, None),
    ("allowed-host", msgs([part("image_url", "https://img.example.com/a.png")]), "application/json", 200, None),
    ("image-url-number", msgs([part("image_url", 5)]), "application/json", 200, None),
    ("video-url-empty", msgs([part("video_url", "")]), "application/json", 200, None),
    ("crlf-in-content", msgs("line one\r\nx-injected: yes\r\n\r\n"), "application/json", 200, None),
    ("nul-in-content", msgs("a\u0000b"), "application/json", 200, None),
    (
        "lone-surrogate",
        b'{"model": "auto", "messages": [{"role": "user", "content": "\\ud800"}]}',
        "application/json",
        200,
        None,
    ),
    ("extra-fields-kept", msgs("hi") | {"foo": {"bar": [1, 2]}, "temperature": 2}, "application/json", 200, None),
    ("content-type-with-charset", msgs("hi"), "application/json; charset=utf-8", 200, None),
]
DROPPED = {"malformed-data-url", "data-url-wrong-mime", "file-url", "ftp-url", "javascript-url", "metadata-host",
           "host-not-allowed", "image-url-number", "video-url-empty"}  # fmt: skip


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, FakeEngine, respx.MockRouter]]:
    engine = FakeEngine({"jailbreak": 0.1})
    with respx.mock(assert_all_called=False) as mock:
        mock.post("http://small.test/v1/chat/completions").mock(
            side_effect=lambda request: httpx.Response(
                200, content=request.content, headers={"content-type": "application/json"}
            )
        )
        # The debug view (server.expose_decisions): the corpus checks what the decision saw (rule, dropped media).
        debug = CONFIG.replace("server: {", "server: {expose_decisions: true, ", 1)
        app: ProxyApp = create_app(parse_config(debug, "c.yaml"), engine=engine, transport=httpx.AsyncHTTPTransport())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as http:
            yield http, engine, mock


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 50
    assert len({case[0] for case in CASES}) == len(CASES)


@pytest.mark.parametrize(("body", "content_type", "status", "message"), [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])  # fmt: skip
async def test_bad_input(
    client: tuple[httpx.AsyncClient, FakeEngine, respx.MockRouter], body: Any, content_type: str, status: int,
    message: str | None, request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    http, engine, _ = client
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await http.post("/v1/chat/completions", content=raw, headers={"content-type": content_type})
    assert response.status_code == status, response.text
    assert response.status_code < 500
    if status >= 400:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        if message:
            assert message in error["message"]
        assert "Traceback" not in response.text
    else:
        assert response.headers["x-d3-rule"] == "default"
        assert "x-injected" not in response.headers
        case = request.node.callspec.id
        if case in DROPPED:
            assert response.headers["x-d3-media-dropped"] == "1"
            assert engine.calls[-1][2:] == ((), ())  # nothing was handed to the engine
        if case == "far-over-state-budget":
            assert response.headers["x-d3-state-truncated"] == str(50_000 - 200)
        if case == "allowed-host":
            assert engine.calls[-1][2] == ("https://img.example.com/a.png",)


# --- properties -----------------------------------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
parts = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "video_url", "input_audio", "x"])},
                              optional={"text": json_values, "image_url": json_values, "video_url": json_values})  # fmt: skip
messages = (
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "role": st.sampled_from(["user", "assistant", "system", "tool", "x"]) | json_values,
                "content": st.text(max_size=50) | st.lists(parts | json_values, max_size=4) | json_values,
            },
        ),
        max_size=6,
    )
    | json_values
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=messages, source=st.sampled_from(["last_user", "conversation", "json"]), budget=st.integers(1, 300))
def test_random_messages_never_crash_extraction(messages: Any, source: str, budget: int) -> None:
    try:
        state = extract_state(messages, StateSettings(source, budget), MediaRules(frozenset({"a.example"}), 1000))  # type: ignore[arg-type]
    except BadChatRequest as exc:
        assert exc.message
        return
    text = json.dumps(state.state) if source == "json" else state.state
    assert isinstance(text, str)
    if source != "json":
        assert len(state.state) <= budget


POLICY = parse_config("""
upstreams: {a: {url: http://a/v1}, b: {url: http://b/v1}}
policies:
  p:
    questions:
      kind: {type: choice, criteria: {code: null, math: null, chat: null}}
      jb: {type: noul}
      level: {type: score, criteria: [l0, l1, l2, l3]}
    rules:
      - {name: r1, when: 'jb > 0.5 and not kind == "chat"', block: {status: 403, message: no}}
      - {name: r2, when: '0.2 < level <= 2.5 or kind.math > 0.3', tag: {x-a: b}}
      - {name: r3, when: 'kind in ["code", "math"] and level.l3 >= 0.1 and jb.confidence < 0.9', route: [b, a]}
      - {name: d, route: a}
""").policies["p"]
probabilities = st.lists(st.floats(0, 1), min_size=3, max_size=3).filter(lambda ps: sum(ps) > 0)


@settings(max_examples=300, deadline=None)
@given(
    kind=probabilities,
    jb=st.floats(0, 1),
    level=st.lists(st.floats(0, 1), min_size=4, max_size=4).filter(lambda ps: sum(ps) > 0),
)
def test_random_answers_never_crash_evaluation(kind: list[float], jb: float, level: list[float]) -> None:
    total_k, total_l = sum(kind), sum(level)
    kinds = dict(zip(["code", "math", "chat"], [p / total_k for p in kind], strict=True))
    levels = tuple(p / total_l for p in level)
    answers = {
        "kind": ChoiceAnswer(max(kinds, key=kinds.__getitem__), kinds, max(kinds.values())),
        "jb": NoulAnswer(jb, max(jb, 1 - jb)),
        "level": ScoreAnswer(sum(i * p for i, p in enumerate(levels)), ("l0", "l1", "l2", "l3"), levels, max(levels)),
    }
    decision = POLICY.evaluate(answers)
    assert decision.rule in {"r1", "r3", "d"}
    assert decision.trace[-1].rule == decision.rule


yaml_scalars = (
    st.none() | st.booleans() | st.integers(-5, 600) | st.floats(allow_nan=False, width=32) | st.text(max_size=12)
)
config_like = st.recursive(
    yaml_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(
        st.sampled_from(["upstreams", "policies", "engine", "server", "rules", "questions", "name", "when", "route",
                         "block", "tag", "set", "type", "criteria", "url", "tests", "answers", "expect", "status",
                         "auto", "small", "x"]),
        children, max_size=4),
    max_leaves=25,
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=config_like)
def test_random_config_files_never_crash_loading(document: Any) -> None:
    text = json.dumps(document)  # JSON is YAML
    try:
        parse_config(text, "random.yaml")
    except ConfigError as exc:
        assert exc.issues and all(str(issue).startswith("random.yaml") for issue in exc.issues)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_random_text_never_crashes_loading(text: str) -> None:
    try:
        parse_config(text, "random.yaml")
    except ConfigError as exc:
        assert exc.issues


@settings(max_examples=300, deadline=None)
@given(source=st.text(alphabet=st.sampled_from(list("kindjb.<>=!()[]\"' andornotin0123456789.code")), max_size=40))
def test_random_conditions_compile_or_fail_cleanly(source: str) -> None:
    from policies import ExpressionError, compile_condition

    questions = {"kind": Choice(None, {"code": None, "chat": None}), "jb": Noul(None), "lv": Score(None, ("a", "b"))}
    try:
        condition, _ = compile_condition(source, questions)
    except ExpressionError as exc:
        assert 0 <= exc.pos <= len(source)
        return
    answers = {"kind": ChoiceAnswer("code", {"code": 0.6, "chat": 0.4}, 0.6), "jb": NoulAnswer(0.3, 0.7),
               "lv": ScoreAnswer(0.5, ("a", "b"), (0.5, 0.5), 0.5)}  # fmt: skip
    assert condition(answers) in (True, False)
