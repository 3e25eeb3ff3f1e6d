"""Reload is atomic: everything new is built before the swap; a failure keeps the old configuration whole and is
answered in JSON; the file is parsed off the event loop; the watcher survives a failure; what needs a restart is
said; old upstream pools close once the requests under the old configuration ended."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from d3backend import FakeEngine
from policies import load_config
from router import create_app
from router._faces import lifecycle, serve
from router._faces.forward import Forwarder
from router._observe.metrics import Metrics
from tests.router.test_sockets import Served

pytestmark = pytest.mark.anyio

CONFIG = """
server: {{admin_token_env: D3_ADMIN{server}}}
upstreams: {{up: {{url: "{url}"}}}}
policies:
  auto:
    questions: {{jailbreak: {{type: noul}}}}
    rules:
      - {{name: guard, when: jailbreak > 0.9, block: {{status: 403, message: Refused.}}}}
      - {{name: {rule}, route: up}}
"""
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello"}]}
ADMIN = {"authorization": "Bearer admin"}


def write(path: Path, *, server: str = "", url: str = "http://up.test/v1", rule: str = "first") -> None:
    path.write_text(CONFIG.format(server=server, url=url, rule=rule), encoding="utf-8")


def make(path: Path, **kwargs: Any) -> Any:
    engine = FakeEngine(lambda state, questions: {"jailbreak": 0.1})
    return create_app(load_config(path), engine=engine, environ={"D3_ADMIN": "admin", "D3_SALT": "salt"}, **kwargs)


async def test_a_decision_log_that_cannot_be_opened_keeps_the_old_configuration(tmp_path: Path) -> None:
    """Before: the new configuration was swapped in, then opening its log raised: a 500 from /admin/reload with the
    new configuration already in force."""
    path = tmp_path / "router.yaml"
    write(path)
    app = make(path, transport=httpx.AsyncHTTPTransport())
    (tmp_path / "blocker").write_text("a file where a folder should be", encoding="utf-8")
    write(path, server=", decision_log: {path: blocker/decisions.jsonl}", rule="second")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
        response = await client.post("/admin/reload", headers=ADMIN)
    assert response.status_code == 422
    assert response.json()["reloaded"] is False and "blocker" in response.json()["message"]
    assert app.config.policies["auto"].rules[-1].name == "first"  # the old one, whole
    assert app.config.server.decision_log is None and app.service.decision_log is None
    await app.aclose()


async def test_the_file_is_parsed_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "router.yaml"
    write(path)
    app = make(path, transport=httpx.AsyncHTTPTransport())
    threads: list[threading.Thread] = []
    real = lifecycle.load_config

    def recording(file: Any) -> Any:
        threads.append(threading.current_thread())
        return real(file)

    monkeypatch.setattr(lifecycle, "load_config", recording)
    write(path, rule="second")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
        assert (await client.post("/admin/reload", headers=ADMIN)).json()["reloaded"] is True
    assert threads and threads[0] is not threading.main_thread()
    assert app.config.policies["auto"].rules[-1].name == "second"
    await app.aclose()


async def test_the_watcher_keeps_watching_after_a_reload_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: an exception from a reload ended the watcher task silently; no reload happened after it."""
    path = tmp_path / "router.yaml"
    write(path)
    app = make(path, transport=httpx.AsyncHTTPTransport())
    calls = 0
    real = app.areload

    async def failing_once() -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("the disk went away")
        return await real()

    monkeypatch.setattr(app, "areload", failing_once)
    watcher = asyncio.create_task(serve._watch(app, 0.01))
    await asyncio.sleep(0)  # the watcher takes the file's first stamp, then sleeps
    try:
        with caplog.at_level(logging.ERROR, logger="router"):
            write(path, rule="second")
            for _ in range(1000):  # bounded: the watcher polls every 10 ms
                if calls == 1:
                    break
                await asyncio.sleep(0.01)
            path.write_text(path.read_text(encoding="utf-8") + "\n", encoding="utf-8")  # a second change
            for _ in range(1000):
                if app.config.policies["auto"].rules[-1].name == "second":
                    break
                await asyncio.sleep(0.01)
    finally:
        watcher.cancel()
    assert calls >= 2 and app.config.policies["auto"].rules[-1].name == "second"
    assert any("failed unexpectedly" in record.getMessage() for record in caplog.records)
    await app.aclose()


async def test_sessions_apply_and_redis_is_said_to_need_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: changes to server.sessions and server.redis were ignored without a word."""
    path = tmp_path / "router.yaml"
    # The salt from the start: server.redis is refused without one (issue 25.6), and a changed salt needs a restart.
    write(path, server=", sessions: {salt_env: D3_SALT}")
    app = make(path, transport=httpx.AsyncHTTPTransport())
    store = app.sessions.store
    write(path, server=", sessions: {header: x-conversation, salt_env: D3_SALT}, redis: 'redis://127.0.0.1:1/0'")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
        with caplog.at_level(logging.WARNING, logger="router"):
            response = await client.post("/admin/reload", headers=ADMIN)
    assert response.status_code == 200
    assert response.json()["restart_needed"] == ["server.redis"]
    assert "server.redis changed; it takes effect on restart" in [r.getMessage() for r in caplog.records]
    assert app.sessions.settings.header == "x-conversation"  # applied
    assert app.sessions.store is store  # Redis: not half-applied
    await app.aclose()


class Gate:
    """An engine that holds the request it answers until released."""

    def __init__(self) -> None:
        self.inner = FakeEngine(lambda state, questions: {"jailbreak": 0.1})
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.hold = False

    async def decide(self, *args: Any, **kwargs: Any) -> Any:
        if self.hold:
            self.held.set()
            await self.release.wait()
        return await self.inner.decide(*args, **kwargs)

    async def aclose(self) -> None:
        pass


async def answer(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"ok": true}'})


async def test_an_old_pool_closes_once_its_requests_ended(tmp_path: Path) -> None:
    """Before: a reload that changed an upstream left its old pool open until the process ended."""
    with Served(answer) as first, Served(answer) as second:
        path = tmp_path / "router.yaml"
        write(path, url=f"{first.url}/v1")
        gate = Gate()
        app = create_app(load_config(path), engine=gate)  # type: ignore[arg-type]
        async with app, httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200  # the pool exists
            (pool,) = app.forwarder._pools.values()
            closed = asyncio.Event()
            real_close = pool.aclose

            async def aclose() -> None:
                closed.set()
                await real_close()

            pool.aclose = aclose  # type: ignore[method-assign]
            gate.hold = True
            other = {**CHAT, "messages": [{"role": "user", "content": "another question"}]}  # not from a cache
            pending = asyncio.create_task(client.post("/v1/chat/completions", json=other))
            await asyncio.wait_for(gate.held.wait(), 10)  # in flight under the old configuration
            write(path, url=f"{second.url}/v1")
            assert (await app.areload()).ok
            await asyncio.sleep(0)
            assert not closed.is_set()  # its request still needs it
            gate.release.set()
            assert (await asyncio.wait_for(pending, 10)).status_code == 200  # the old upstream, through the old pool
            await asyncio.wait_for(closed.wait(), 10)
            gate.hold = False
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200  # the new upstream


async def test_a_retired_pool_still_serves_the_old_configurations_requests() -> None:
    from policies import parse_config

    old = parse_config(CONFIG.format(server="", url="http://a.test/v1", rule="r"), "c.yaml")
    new = parse_config(CONFIG.format(server="", url="http://b.test/v1", rule="r"), "c.yaml")
    forwarder = Forwarder({}, Metrics(), None)
    pool = forwarder.transport("up", old.upstreams["up"])
    assert forwarder.retire(new) == [pool]
    assert forwarder.transport("up", old.upstreams["up"]) is pool  # a request under the old configuration
    assert forwarder.transport("up", new.upstreams["up"]) is not pool
    await forwarder.close_retired([pool])
    assert forwarder._retired == {}
    await forwarder.aclose()


async def test_a_broken_keys_file_keeps_the_running_configuration_and_keys(tmp_path: Path) -> None:
    """The merge of atomic reload with client keys: the keys are built with everything else, before the swap, so a
    keys file that does not load keeps both the running configuration and the running keys."""
    key = "sk-ci-0123456789abcdef"
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"keys: [{{name: ci, key: {key}}}]\n", encoding="utf-8")
    path = tmp_path / "router.yaml"
    write(path, server=", auth: {keys_file: keys.yaml}")
    app = make(path, transport=httpx.AsyncHTTPTransport())
    write(path, server=", auth: {keys_file: keys.yaml}", rule="second")
    keys.write_text("keys: [{name: ci, key: short}]\n", encoding="utf-8")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as client:
        response = await client.post("/admin/reload", headers=ADMIN)
    assert response.status_code == 422 and response.json()["reloaded"] is False
    assert app.config.policies["auto"].rules[-1].name == "first"  # not half-applied
    assert app.access.caller([(b"authorization", f"Bearer {key}".encode())]).name == "ci"
    await app.aclose()
