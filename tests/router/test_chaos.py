"""Faults under mixed load (issue 24, item 6): two `d3router serve` replicas sharing sessions in a real redis-server,
64 clients at once on the four APIs, streamed and not, while the engine, the upstream and redis-server are killed
with SIGKILL and restarted in turn. Every request gets a well-formed answer (2xx, or the policy's or the router's
error in the API's own shape), none hangs, none is a 500, and every decision is logged.

Bounded in time: the load lasts while each part is killed twice (about 15 s on a quiet machine), at most 120 s;
after it, every replica must answer every API again once the parts are back. The peers are the benchmarks' own processes: the canned engine
(`benchmarks._canned`) and the canned upstream (`benchmarks._upstream`, streams paced so that kills land mid-stream).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from d3backend import free_port
from tests.router._peers import start, wait_ready
from tests.router._redis import RedisServer

REPO = Path(__file__).resolve().parents[2]
LOAD_CAP_S = 120.0
KILLS = 2  # per part
CLIENTS = 64
CONFIG = """
server:
  redis: {redis}
  sessions: {{salt_env: SALT}}
  decision_log: {{path: {log}}}
engine:
  remote: {{urls: ["http://127.0.0.1:{engine}"], model: d3-tiny, timeout_s: 0.5}}
upstreams:
  up: {{url: "http://127.0.0.1:{upstream}/v1", model: m, timeout_s: 5}}
policies:
  auto:
    on_engine_error: {{block: {{status: 503, message: The guard is unavailable.}}}}
    questions:
      jailbreak: {{type: noul}}
      kind: {{type: choice, criteria: {{code: Code, math: Math, chat: Chat}}}}
    rules:
      - {{name: refuse, when: jailbreak > 0.8, block: {{status: 403}}}}
      - {{name: default, route: up}}
"""
# Path, body, and what ends a whole stream, per API.
APIS = {
    "chat": ("/v1/chat/completions", lambda text: {"messages": [{"role": "user", "content": text}]}, b"data: [DONE]"),
    "completions": ("/v1/completions", lambda text: {"prompt": text}, b"data: [DONE]"),
    "responses": ("/v1/responses", lambda text: {"input": text}, b"response.completed"),
    "messages": ("/v1/messages", lambda text: {"max_tokens": 8, "messages": [{"role": "user", "content": text}]},
                 b"message_stop"),
}  # fmt: skip


class Peer:
    """A process of the tests' own on a fixed port, killed with SIGKILL and started again on the same port."""

    def __init__(self, argv: list[str], ready: str) -> None:
        self.argv, self.ready = argv, ready
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = start(self.argv, self.ready)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.communicate(timeout=10)
            self.process = None


@dataclass
class Tally:
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    decided: int = 0
    ended_by_error: int = 0  # streams whose upstream died mid-way, ended with the API's error event
    wrong: list[str] = field(default_factory=list)


def check(api: str, stream: bool, response: httpx.Response, body: bytes, tally: Tally) -> None:
    """One answer, judged: a 2xx is whole (a stream ends as its API ends one, or with its API's error event); an
    error is the API's own error body; never a 500."""
    tally.statuses[(api, response.status_code)] += 1
    tally.decided += "x-d3-action" in response.headers
    what = f"{api} stream={stream} {response.status_code}: {body[:300]!r}"
    if response.status_code == 200:
        if stream and APIS[api][2] not in body:
            if not stream_error(api, body):
                tally.wrong.append(f"a stream that ended neither whole nor with an error event: {what}")
            tally.ended_by_error += 1
        elif not stream:
            json.loads(body)
        return
    if response.status_code not in (403, 502, 503, 504):
        tally.wrong.append(f"an unexpected status: {what}")
        return
    error = json.loads(body)
    if api == "messages":
        good = error.get("type") == "error" and isinstance(error.get("error", {}).get("message"), str)
    else:
        good = isinstance(error.get("error", {}).get("message"), str)
    if not good:
        tally.wrong.append(f"an error not in the API's shape: {what}")


def stream_error(api: str, body: bytes) -> bool:
    """The stream's last event is its API's error event."""
    last = body.rstrip().rsplit(b"\n\n", 1)[-1]
    data = json.loads(last.split(b"data: ", 1)[1]) if b"data: " in last else {}
    if api == "messages":
        return b"event: error" in last and data.get("type") == "error"
    if api == "responses":
        return data.get("type") in ("error", "response.failed")
    return isinstance(data.get("error"), dict)


async def client(urls: list[str], done: threading.Event, tally: Tally, seed: int) -> None:
    chance = random.Random(seed)
    session = f"chaos-{seed}"
    limits = httpx.Limits(max_connections=1)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0), limits=limits) as http:
        for turn in itertools.count():
            if done.is_set():
                return
            api = chance.choice(list(APIS))
            stream = chance.random() < 0.5
            path, body, _ = APIS[api]
            # A new text each time: a cached decision would not ask the engine, dead or alive.
            request = {"model": "auto", "stream": stream, **body(f"hi {seed} {turn}")}
            headers = {"x-session-id": session}
            url = chance.choice(urls)
            try:
                async with http.stream("POST", url + path, json=request, headers=headers) as response:
                    received = await response.aread()
            except httpx.TimeoutException:
                tally.wrong.append(f"{api} stream={stream}: no answer within 30 s")
                continue
            except httpx.HTTPError as exc:
                tally.wrong.append(f"{api} stream={stream}: {type(exc).__name__} {exc}")
                continue
            check(api, stream, response, received, tally)


def chaos(peers: list[Peer], redis: RedisServer, done: threading.Event, kills: Counter[str]) -> None:
    """Kill one part every 1.5 s, in turn, and start it again 0.5 s later, until each has died KILLS times; then 2 s
    more load with all of them up, and the load ends."""
    parts = ["engine", "upstream", "redis"]
    try:
        for part in parts * KILLS:
            if done.wait(1.5):
                return
            if part == "redis":
                redis.stop()
            else:
                peers[parts.index(part)].kill()
            kills[part] += 1
            time.sleep(0.5)
            if part == "redis":
                redis.start()
            else:
                peers[parts.index(part)].start()
        done.wait(2.0)
    finally:
        done.set()


async def recovered(urls: list[str], tally: Tally) -> list[str]:
    """After the last restart every replica answers every API, streamed and not, with a whole 200 within 60 s (the
    engine's URL may still be set aside, and Redis's retry interval may still run, for a moment)."""
    missing = []
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as http:
        for url, api, stream in itertools.product(urls, APIS, (False, True)):
            path, body, whole = APIS[api]
            for attempt in itertools.count():
                request = {"model": "auto", "stream": stream, **body(f"after {url} {api} {stream} {attempt}")}
                async with http.stream("POST", url + path, json=request) as response:
                    received = await response.aread()
                check(api, stream, response, received, tally)
                if response.status_code == 200 and (not stream or whole in received):
                    break
                if time.monotonic() > deadline:
                    missing.append(f"{url} {api} stream={stream}: {response.status_code} {received[:200]!r}")
                    break
                await asyncio.sleep(0.5)
    return missing


def serve(config: Path, port: int, output: Path) -> subprocess.Popen[bytes]:
    """`d3router serve`, its output to a file: a pipe nobody reads while the load runs would fill and stall it."""
    with output.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "router", "serve", str(config), "--port", str(port)],
                                   stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "SALT": "chaos-salt"})  # fmt: skip
    wait_ready(f"http://127.0.0.1:{port}/healthz", process)
    return process


def stop(process: subprocess.Popen[bytes]) -> int | None:
    """SIGINT, as an operator stops it: the in-flight requests end and the decision log is flushed."""
    process.send_signal(signal.SIGINT)
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None


@pytest.fixture
def peers() -> Iterator[list[Peer]]:
    engine, upstream = free_port(), free_port()
    parts = [
        Peer(["-m", "benchmarks._canned", str(engine)], f"http://127.0.0.1:{engine}/v1/systemone"),
        Peer(["-m", "benchmarks._upstream", str(upstream), "--gap-ms", "20"],
             f"http://127.0.0.1:{upstream}/v1/chat/completions"),
    ]  # fmt: skip
    try:
        for part in parts:
            part.start()
        yield parts
    finally:
        for part in parts:
            part.kill()


def test_every_request_is_answered_while_the_engine_the_upstream_and_redis_die(
    tmp_path: Path, peers: list[Peer], redis_server: RedisServer
) -> None:
    engine, upstream = (int(peer.ready.split(":")[2].split("/")[0]) for peer in peers)
    routers, urls, logs = [], [], []
    try:
        for replica in ("a", "b"):
            log = tmp_path / f"decisions-{replica}.jsonl"
            path = tmp_path / f"router-{replica}.yaml"
            config = CONFIG.format(redis=redis_server.url, log=log, engine=engine, upstream=upstream)
            path.write_text(config, encoding="utf-8")
            port = free_port()
            routers.append(serve(path, port, tmp_path / f"router-{replica}.out"))
            urls.append(f"http://127.0.0.1:{port}")
            logs.append(log)
        tally, kills, done = Tally(), Counter[str](), threading.Event()
        killer = threading.Thread(target=chaos, args=(peers, redis_server, done, kills))
        killer.start()
        cap = threading.Timer(LOAD_CAP_S, done.set)
        cap.start()

        async def load() -> list[str]:
            await asyncio.gather(*(client(urls, done, tally, seed) for seed in range(CLIENTS)))
            return await recovered(urls, tally)

        try:
            missing = asyncio.run(load())
        finally:
            done.set()
            cap.cancel()
            killer.join()
    finally:
        codes = [stop(router) for router in routers]
    print(f"chaos: {sum(tally.statuses.values())} requests, kills {dict(kills)}, {dict(tally.statuses)}, "
          f"{tally.ended_by_error} streams ended by an error event")  # fmt: skip
    assert tally.wrong == [], f"{len(tally.wrong)} bad answers, first: {tally.wrong[:5]}"
    assert codes == [0, 0], [(tmp_path / f"router-{r}.out").read_text()[-3000:] for r in "ab"]
    assert kills == {"engine": KILLS, "upstream": KILLS, "redis": KILLS}, "the load ran while every part died"
    assert missing == [], "every replica answers every API again once the parts are back"
    by_status = Counter(status for (_, status) in tally.statuses.elements())
    assert by_status[503] > 0, "the engine's deaths were answered by on_engine_error"
    logged = sum(len(log.read_text(encoding="utf-8").splitlines()) for log in logs)
    assert logged == tally.decided, "every decision is logged, once"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q", "-s"]))
