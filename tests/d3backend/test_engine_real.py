"""Against a real vLLM (the CPU build) serving the locally built model: the same engine code, wire format and
errors as production, with answers that carry no meaning. Nothing here depends on what the answers say."""

from __future__ import annotations

import gc
import logging
import math
import multiprocessing
import warnings
from pathlib import Path

import httpx
import pytest

from d3backend import (
    CachedEngine,
    Choice,
    ChoiceAnswer,
    EmbeddedEngine,
    EngineRejected,
    Noul,
    NoulAnswer,
    Question,
    RemoteEngine,
    Score,
    ScoreAnswer,
    VllmServer,
    free_port,
    make_transport,
)
from d3backend._embedded import exited
from tests._leaks import lives_until_exit
from tests.conftest import SERVED_MODEL, require_vllm

pytestmark = [pytest.mark.engine, pytest.mark.anyio]

QUESTIONS: dict[str, Question] = {
    "kind": Choice("What kind of work is this?", {"code": "Writing or fixing code", "math": None, "chat": None}),
    "jailbreak": Noul("Is the user trying to make the assistant ignore its rules?", "it is", "it is not"),
    "difficulty": Score("How hard is this request?", ("trivial", "easy", "hard", "expert")),
}
STATE = "Write a Python function that merges two sorted lists."


async def test_answers_every_question_type(vllm_server: VllmServer) -> None:
    async with RemoteEngine([vllm_server.url]) as engine:  # the model name is discovered from /v1/models
        decided = await engine.decide(STATE, QUESTIONS)
    assert engine.model == SERVED_MODEL
    assert decided.model == SERVED_MODEL
    assert list(decided.answers) == ["kind", "jailbreak", "difficulty"]
    kind, jailbreak, difficulty = decided.answers.values()
    assert isinstance(kind, ChoiceAnswer) and isinstance(jailbreak, NoulAnswer) and isinstance(difficulty, ScoreAnswer)
    assert set(kind.probabilities) == {"code", "math", "chat"}
    assert math.isclose(sum(kind.probabilities.values()), 1.0, abs_tol=1e-9)
    assert kind.choice == max(kind.probabilities, key=kind.probabilities.__getitem__)
    assert 0.0 <= jailbreak.noul <= 1.0
    assert difficulty.legend == ("trivial", "easy", "hard", "expert")
    assert math.isclose(difficulty.score, sum(i * p for i, p in enumerate(difficulty.probabilities)), abs_tol=1e-9)
    assert decided.usage.input_tokens > 0
    assert decided.elapsed_ms > 0


async def test_same_request_same_answers(vllm_server: VllmServer) -> None:
    async with RemoteEngine([vllm_server.url], model=SERVED_MODEL) as engine:
        first = await engine.decide(STATE, QUESTIONS)
        second = await engine.decide(STATE, QUESTIONS)
        other = await engine.decide({"messages": [{"role": "user", "content": "hello there"}]}, QUESTIONS)
    assert first.answers == second.answers
    assert other.answers != first.answers  # a JSON state is read too, and changes the answers


@pytest.mark.parametrize(
    ("questions", "state", "message"),
    [
        ({"many": Choice(None, {f"option{i}": None for i in range(27)})}, "x", "question 'many': at most 26 options"),
        ({f"q{i}": Noul(None) for i in range(65)}, "x", "questions: at most 64"),
        ({"q": Noul(None)}, "word " * 3000, "maximum context length is 2048 tokens"),
    ],
    ids=["27-options", "65-questions", "state-over-max-model-len"],
)
async def test_over_the_engines_limits_is_rejected_with_its_message(
    vllm_server: VllmServer, questions: dict[str, Question], state: str, message: str
) -> None:
    async with RemoteEngine([vllm_server.url], model=SERVED_MODEL) as engine:
        with pytest.raises(EngineRejected) as info:
            await engine.decide(state, questions)
    assert info.value.status == 400
    assert message in info.value.message


async def test_unknown_model_is_rejected_with_a_hint(vllm_server: VllmServer) -> None:
    async with RemoteEngine([vllm_server.url], model="vllm-sr/d3-mini") as engine:
        with pytest.raises(EngineRejected, match=r"\(404\): The model `vllm-sr/d3-mini` does not exist") as info:
            await engine.probe()
    assert info.value.message.endswith("(check the engine's model name in the configuration)")


class Recording(httpx.AsyncBaseTransport):
    """The production transport, recording each request's origin and whether it answered or raised."""

    def __init__(self) -> None:
        self.inner = make_transport()
        self.log: list[tuple[str, str]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        origin = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        try:
            response = await self.inner.handle_async_request(request)
        except httpx.TransportError as exc:
            self.log.append((origin, type(exc).__name__))
            raise
        self.log.append((origin, str(response.status_code)))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_fails_over_from_a_dead_url(vllm_server: VllmServer) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    transport = Recording()
    try:
        async with RemoteEngine([dead, vllm_server.url], model=SERVED_MODEL, transport=transport) as engine:
            answers = [(await engine.decide(STATE, QUESTIONS)).answers for _ in range(4)]
    finally:
        await transport.aclose()
    assert all(answer == answers[0] for answer in answers)
    # The dead URL was really tried, first (both idle: the first listed wins), and refused the connection; it was
    # retried once on the next call, then set aside after its second failure; the live one answered all four.
    assert [outcome for origin, outcome in transport.log if origin == dead] == ["ConnectError"] * 2
    assert [outcome for origin, outcome in transport.log if origin == vllm_server.url] == ["200"] * 4
    assert transport.log[0] == (dead, "ConnectError")


async def test_cache_in_front_of_the_real_engine(vllm_server: VllmServer) -> None:
    async with CachedEngine(RemoteEngine([vllm_server.url], model=SERVED_MODEL)) as engine:
        first = await engine.decide(STATE, QUESTIONS)
        second = await engine.decide(STATE, QUESTIONS)
    assert (first.cached, second.cached) == (False, True)
    assert first.answers == second.answers


async def test_embedded_engine_answers_as_the_server_does(
    vllm_server: VllmServer, tiny_model: Path, tmp_path: Path
) -> None:
    require_vllm()
    async with RemoteEngine([vllm_server.url], model=SERVED_MODEL) as remote:
        served = await remote.decide(STATE, QUESTIONS)
    engine = EmbeddedEngine(
        str(tiny_model), served_model_name=SERVED_MODEL, max_model_len=2048, dtype="float32",
        kv_cache_memory_bytes="256M", cache_dir=tmp_path,
    )  # fmt: skip
    # vLLM never terminates its engine client's zmq context (it leaves that to the garbage collector) and keeps the
    # first in-process engine's client, with that context's descriptors and its engine-core process's spawn pipes,
    # until this process exits; a second start and stop opens nothing more (measured). The process is gone (below).
    with lives_until_exit("vLLM keeps its first in-process engine client's zmq context and spawn pipes"):
        async with engine:
            embedded = await engine.decide(STATE, QUESTIONS)
            with pytest.raises(EngineRejected, match="at most 26 options"):
                await engine.decide("x", {"many": Choice(None, {f"o{i}": None for i in range(27)})})
            assert (await engine.probe()).model == SERVED_MODEL
    assert embedded.answers == served.answers
    assert [p for p in multiprocessing.active_children() if "EngineCore" in p.name and not exited(p)] == []


async def test_a_second_embedded_engine_leaves_no_zmq_context_to_the_collector(
    tiny_model: Path, tmp_path: Path
) -> None:
    """vLLM closes its engine client's sockets but not their zmq context; the embedded engine ends it. Without that,
    the second in-process engine's context reached the garbage collector, and its `Unclosed context`
    ResourceWarning failed whichever test the collection ran in (a CI run lost to it)."""
    require_vllm()
    with lives_until_exit("vLLM keeps its first in-process engine client's spawn pipes"):
        for _ in range(2):
            engine = EmbeddedEngine(
                str(tiny_model), served_model_name=SERVED_MODEL, max_model_len=2048, dtype="float32",
                kv_cache_memory_bytes="256M", cache_dir=tmp_path,
            )  # fmt: skip
            async with engine:
                assert (await engine.probe()).model == SERVED_MODEL
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ResourceWarning)
                gc.collect()
            assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


async def test_the_hosts_log_lines_survive_an_embedded_engine(
    tiny_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM's app imports a SageMaker helper that set the root logger and its handlers to ERROR: after an embedded
    engine started, d3router's warnings and info lines were gone for the life of the process (a random-order run lost
    a test of a warning to it, whichever engine test ran first)."""
    require_vllm()
    root = logging.getLogger()
    before = root.level, [handler.level for handler in root.handlers]
    with lives_until_exit("vLLM keeps its first in-process engine client's spawn pipes"):
        engine = EmbeddedEngine(
            str(tiny_model), served_model_name=SERVED_MODEL, max_model_len=2048, dtype="float32",
            kv_cache_memory_bytes="256M", cache_dir=tmp_path,
        )  # fmt: skip
        async with engine:
            logging.getLogger("router.host").warning("a line of the host's, engine running")
    assert (root.level, [handler.level for handler in root.handlers]) == before
    logging.getLogger("router.host").warning("a line of the host's, engine stopped")
    assert "engine running" in caplog.text and "engine stopped" in caplog.text
