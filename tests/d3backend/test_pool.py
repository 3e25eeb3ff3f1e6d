"""RemoteEngine as a pool (issue 14.5): least outstanding requests under load, ejection, the background probe that
brings a URL back, the probing task's life, per-URL stats, and URLs without their credentials."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import respx

from d3backend import EngineUnavailable, Noul, Question, RemoteEngine, UrlStats, redact_url

pytestmark = pytest.mark.anyio

A, B = "http://d3-a:8000", "http://d3-b:8000"
QUESTIONS: dict[str, Question] = {"jailbreak": Noul("Jailbreak?")}
ANSWER = {
    "answers": {
        "jailbreak": {"type": "noul", "noul": 0.25, "probabilities": {"yes": 0.25, "no": 0.75}, "confidence": 0.75}
    }
}
WAIT_S = 10.0  # for conditions that take milliseconds: a loaded machine is no failure


@pytest.fixture
async def mock() -> AsyncIterator[respx.MockRouter]:
    with respx.mock(assert_all_mocked=True, assert_all_called=False) as router:
        yield router


def ok(request: httpx.Request | None = None) -> httpx.Response:
    return httpx.Response(200, json=ANSWER)


def engine(*urls: str, model: str | None = "m", **kwargs: Any) -> RemoteEngine:
    return RemoteEngine(list(urls), model=model, transport=httpx.AsyncHTTPTransport(), **kwargs)


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not within {WAIT_S} s: {what}"
        await asyncio.sleep(0.005)


def probers() -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks() if "_probe_ejected" in repr(task.get_coro())]


async def test_with_one_url_slow_the_other_takes_the_load(mock: respx.MockRouter) -> None:
    """Four clients calling in a loop: each call to A hangs (until released), B answers at once. Least outstanding
    sends A no more once it holds more than B; round-robin would strand every client on A within two calls."""
    release = asyncio.Event()

    async def slow(request: httpx.Request) -> httpx.Response:
        await release.wait()
        return ok()

    a = mock.post(f"{A}/v1/systemone").mock(side_effect=slow)
    b = mock.post(f"{B}/v1/systemone").mock(side_effect=ok)
    async with engine(A, B) as remote:

        async def client() -> None:
            for _ in range(10):
                await remote.decide("x", QUESTIONS)

        clients = [asyncio.create_task(client()) for _ in range(4)]
        # Wait until every client is done or held by A.
        await until(lambda: sum(c.done() for c in clients) + remote.pool_stats()[0].in_flight == 4, "clients settle")
        held = remote.pool_stats()[0].requests  # RESPX counts a call once it is answered
        assert 1 <= held <= 2 and b.call_count == 10 * (4 - held)
        release.set()
        await asyncio.gather(*clients)
    stats = {url.url: url for url in remote.pool_stats()}
    assert stats[A].requests == a.call_count and stats[B].requests == b.call_count
    assert stats[A].in_flight == stats[B].in_flight == 0


async def test_two_failures_eject_a_url_and_live_calls_pass_it_over(mock: respx.MockRouter) -> None:
    a = mock.post(f"{A}/v1/systemone").mock(side_effect=httpx.ConnectError("refused"))
    b = mock.post(f"{B}/v1/systemone").mock(side_effect=ok)
    async with engine(A, B, backoff_s=30) as remote:
        assert remote.pool_stats()[0] == UrlStats(A, 0, True, None, 0, 0, 0, 0, 0)
        for _ in range(10):
            await remote.decide("x", QUESTIONS)
        assert a.call_count == 2 and b.call_count == 10
        stats = remote.pool_stats()[0]
        assert (stats.healthy, stats.requests, stats.failures, stats.ejections, stats.probes) == (False, 2, 2, 1, 0)
        assert stats.ejected_until is not None and stats.ejected_until > asyncio.get_running_loop().time() + 20
        assert remote.pool_stats()[1].healthy


async def test_a_probe_brings_an_ejected_url_back_without_a_live_call(mock: respx.MockRouter) -> None:
    a = mock.post(f"{A}/v1/systemone").mock(side_effect=httpx.ConnectError("refused"))
    b = mock.post(f"{B}/v1/systemone").mock(side_effect=ok)
    async with engine(A, B, backoff_s=0.01, max_backoff_s=0.05) as remote:
        for _ in range(4):
            await remote.decide("x", QUESTIONS)
        await until(lambda: remote.pool_stats()[0].probe_failures >= 3, "failed probes")  # backoff doubles, capped
        assert not remote.pool_stats()[0].healthy
        a.side_effect = ok
        await until(lambda: remote.pool_stats()[0].healthy, "a probe returns A")
        stats = remote.pool_stats()[0]
        assert stats.requests == 2 and stats.ejected_until is None  # no live call was sent to find out
        assert stats.probes == a.call_count - 2 and stats.probe_failures == stats.probes - 1
        probe = json.loads(a.calls.last.request.content)
        assert probe["model"] == "m" and list(probe["questions"]) == ["ready"]
        before = b.call_count
        for _ in range(4):
            await remote.decide("x", QUESTIONS)
        assert remote.pool_stats()[0].requests == 4 and b.call_count == before + 2  # taking turns again


async def test_a_url_answering_5xx_to_probes_stays_out(mock: respx.MockRouter) -> None:
    mock.post(f"{A}/v1/systemone").mock(return_value=httpx.Response(503, json={"error": {"message": "loading"}}))
    mock.post(f"{B}/v1/systemone").mock(side_effect=ok)
    async with engine(A, B, backoff_s=0.01, max_backoff_s=0.02) as remote:
        for _ in range(3):
            await remote.decide("x", QUESTIONS)
        await until(lambda: remote.pool_stats()[0].probes >= 3, "probes")
        assert not remote.pool_stats()[0].healthy and remote.pool_stats()[0].requests == 2


async def test_without_a_model_name_the_probe_asks_for_the_model_list(mock: respx.MockRouter) -> None:
    models = mock.get(f"{A}/v1/models").mock(side_effect=httpx.ConnectError("refused"))
    async with engine(A, model=None, backoff_s=0.01, max_backoff_s=0.02) as remote:
        for _ in range(2):
            with pytest.raises(EngineUnavailable, match=r"^cannot reach the engine at http://d3-a:8000: "):
                await remote.decide("x", QUESTIONS)
        models.side_effect = None
        models.return_value = httpx.Response(200, json={"data": [{"id": "served"}]})
        await until(lambda: remote.pool_stats()[0].healthy, "a probe returns A")


async def test_the_probing_task_starts_at_an_ejection_and_ends_when_none_is_left(mock: respx.MockRouter) -> None:
    a = mock.post(f"{A}/v1/systemone").mock(side_effect=httpx.ConnectError("refused"))
    mock.post(f"{B}/v1/systemone").mock(side_effect=ok)
    async with engine(A, B, backoff_s=0.01) as remote:
        await remote.decide("x", QUESTIONS)
        assert probers() == []  # none before the first ejection
        await remote.decide("x", QUESTIONS)
        assert len(probers()) == 1
        a.side_effect = ok
        await until(lambda: probers() == [], "the task ends once A is back")
        assert remote.pool_stats()[0].healthy


async def test_aclose_cancels_the_probing_task(mock: respx.MockRouter) -> None:
    mock.post(f"{A}/v1/systemone").mock(side_effect=httpx.ConnectError("refused"))
    mock.post(f"{B}/v1/systemone").mock(side_effect=ok)
    remote = engine(A, B, backoff_s=30)
    for _ in range(2):
        await remote.decide("x", QUESTIONS)
    [task] = probers()
    async with asyncio.timeout(WAIT_S):  # the task sleeps 30 s: only a cancel ends it in time
        await remote.aclose()
    assert task.cancelled() and probers() == []


async def test_a_probing_task_that_died_is_started_again(mock: respx.MockRouter) -> None:
    a = mock.post(f"{A}/v1/systemone").mock(side_effect=httpx.ConnectError("refused"))
    mock.post(f"{B}/v1/systemone").mock(side_effect=ok)
    async with engine(A, B, backoff_s=0.01) as remote:
        for _ in range(2):
            await remote.decide("x", QUESTIONS)
        [task] = probers()
        task.cancel()  # as if it had ended on an error nobody foresaw
        await asyncio.wait([task])
        a.side_effect = ok
        await remote.decide("x", QUESTIONS)  # a live call notices
        await until(lambda: remote.pool_stats()[0].healthy, "a new task's probe returns A")


async def test_an_ejected_url_is_probed_even_while_every_call_fails_fast(mock: respx.MockRouter) -> None:
    a = mock.post(f"{A}/v1/systemone").mock(side_effect=httpx.ConnectError("refused"))
    async with engine(A, backoff_s=0.01) as remote:
        for _ in range(2):
            with pytest.raises(EngineUnavailable, match="cannot reach"):
                await remote.decide("x", QUESTIONS)
        with pytest.raises(EngineUnavailable, match=r"^every engine URL failed repeatedly and is set aside"):
            await remote.decide("x", QUESTIONS)
        a.side_effect = ok
        await until(lambda: remote.pool_stats()[0].healthy, "a probe returns A")
        await remote.decide("x", QUESTIONS)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:secret@d3-a:8000", "http://d3-a:8000"),
        ("https://secret@d3-a/engine/", "https://d3-a/engine/"),
        ("http://:secret@[::1]:8000", "http://[::1]:8000"),
        ("http://d3-a:8000", "http://d3-a:8000"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


async def test_credentials_stay_out_of_errors_logs_and_stats(
    mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    mock.post(f"{A}/v1/systemone").mock(side_effect=httpx.ConnectError("refused"))
    caplog.set_level(logging.INFO, logger="d3backend")
    async with engine("http://user:secret@d3-a:8000", backoff_s=30) as remote:
        messages = []
        for _ in range(3):
            with pytest.raises(EngineUnavailable) as info:
                await remote.decide("x", QUESTIONS)
            messages.append(str(info.value))
        assert remote.pool_stats()[0].url == A
        assert remote.urls == ("http://user:secret@d3-a:8000",)  # the configured URL, to send with
    assert "http://d3-a:8000" in messages[0]
    assert "set aside" in caplog.text and "d3-a:8000" in caplog.text
    assert not [text for text in [*messages, caplog.text] if "secret" in text or "user" in text]
