"""The engine pool over real processes (issue 14.5): two fake engines, one killed and restarted on its port under a
steady load. No decision fails beyond the calls in flight at the kill, and the revived URL takes traffic again, as
`/metrics` shows per engine URL. Also the per-URL families' shape."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from d3backend import Noul, RemoteEngine, free_port
from policies import parse_config
from router import create_app
from router._cli.main import main
from router._observe.metrics import Metrics
from tests.router.test_faults import Upstream
from tests.router.test_sockets import Served

CLIENTS = 4  # concurrent clients, each sending one request after the other
DEADLINE_S = 60.0  # for conditions that take a second or two: a loaded machine is no failure
REPO = Path(__file__).resolve().parents[2]

CONFIG = """
engine: {{remote: {{urls: ["{a}", "{b}"], model: m, timeout_s: 2.0}}, cache: {{max_entries: 0}}}}
server: {{decision_timeout_s: 5.0}}
upstreams: {{chat: {{url: "{upstream}/v1", timeout_s: 5.0}}}}
policies:
  auto:
    questions: {{j: {{type: noul}}}}
    rules:
      - {{name: guard, when: j > 0.9, block: {{status: 403, message: no}}}}
      - {{name: default, route: chat}}
"""


class EngineProcess:
    """tests/router/test_faults.py's fake engine under uvicorn in a process of its own, on a fixed port."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.script = tmp_path / f"engine_{self.port}.py"
        self.script.write_text(
            "import sys, uvicorn\nfrom tests.router.test_faults import Engine\n"
            "uvicorn.run(Engine(), host='127.0.0.1', port=int(sys.argv[1]), log_level='warning')\n",
            encoding="utf-8",
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.process = subprocess.Popen([sys.executable, str(self.script), str(self.port)], cwd=REPO, env=env)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                httpx.post(f"{self.url}/v1/systemone", content=b"{}", timeout=1)
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.kill()
                    raise RuntimeError(f"the fake engine on port {self.port} did not start") from None
                time.sleep(0.1)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()


class Load:
    """CLIENTS threads sending chat requests one after the other until stopped; every response is kept."""

    def __init__(self, proxy: Served) -> None:
        self.proxy = proxy
        self.results: list[tuple[int, str | None]] = []  # (status, x-d3-degraded)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CLIENTS)]

    def _client(self) -> None:
        body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                response = client.post(f"{self.proxy.url}/v1/chat/completions", json=body)
                self.results.append((response.status_code, response.headers.get("x-d3-degraded")))

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def failed(self) -> list[tuple[int, str | None]]:
        return [result for result in list(self.results) if result != (200, None)]


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(proxy: Served) -> Samples:
    return scrape_url(proxy.url)


def scrape_url(url: str, client: httpx.Client | None = None) -> Samples:
    text = (client.get if client else httpx.get)(f"{url}/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def ok_calls(samples: Samples, url: str) -> float:
    return samples.get(("d3router_engine_url_requests_total", (("result", "ok"), ("url", url))), 0.0)


def healthy(samples: Samples, url: str) -> float | None:
    return samples.get(("d3router_engine_url_healthy", (("url", url),)))


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {what}"
        time.sleep(0.05)


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[tuple[EngineProcess, EngineProcess]]:
    a, b = EngineProcess(tmp_path), EngineProcess(tmp_path)
    try:
        a.start()
        b.start()
        yield a, b
    finally:
        a.kill()
        b.kill()


def test_an_engine_killed_and_restarted_mid_run(engines: tuple[EngineProcess, EngineProcess]) -> None:
    a, b = engines
    with Served(Upstream()) as upstream:
        config = parse_config(CONFIG.format(a=a.url, b=b.url, upstream=upstream.url))
        with Served(create_app(config)) as proxy, Load(proxy) as load:
            wait_for(lambda: min(ok_calls(scrape(proxy), url) for url in (a.url, b.url)) >= 20, "both URLs serve")
            assert load.failed() == []

            a.kill()
            wait_for(lambda: healthy(scrape(proxy), a.url) == 0, "A is ejected")
            at_ejection = scrape(proxy)
            served = len(load.results)
            wait_for(lambda: len(load.results) >= served + 50, "B serves alone")
            assert ok_calls(scrape(proxy), a.url) == ok_calls(at_ejection, a.url)  # none went to A meanwhile

            a.start()  # on the same port
            wait_for(lambda: healthy(scrape(proxy), a.url) == 1, "a probe brings A back")
            wait_for(lambda: ok_calls(scrape(proxy), a.url) >= ok_calls(at_ejection, a.url) + 20, "A serves again")
    # At most the calls in flight at the kill may have been decided without the engine (retried on B, none is,
    # as measured); every other answer is a full decision.
    assert len(load.failed()) <= CLIENTS and all(result == (200, "engine-error") for result in load.failed())
    assert len(load.results) >= 150


def test_the_engine_url_families() -> None:
    """Shape and values of the per-URL families, credentials left out of the labels."""
    calls = {"a": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "d3-b":
            raise httpx.ConnectError("refused", request=request)
        calls["a"] += 1
        answer = {"type": "noul", "noul": 0.1, "probabilities": {"yes": 0.1, "no": 0.9}, "confidence": 0.9}
        return httpx.Response(200, json={"answers": {"j": answer}})

    async def run() -> str:
        engine = RemoteEngine(["http://alice:hunter2@d3-a:8000", "http://d3-b:8000"], model="m", backoff_s=30,
                              transport=httpx.MockTransport(handler))  # fmt: skip
        async with engine:
            for _ in range(4):
                await engine.decide("x", {"j": Noul("j?")})
            metrics = Metrics()
            metrics.engine_pool(engine)
            metrics.engine_pool(engine)  # a second scrape adds nothing that did not grow
            return metrics.render()

    text = asyncio.run(run())
    assert "hunter2" not in text and "alice" not in text
    families = {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("d3router_engine_url")}
    assert {name: family.type for name, family in families.items()} == {
        "d3router_engine_url_in_flight": "gauge",
        "d3router_engine_url_healthy": "gauge",
        "d3router_engine_url_requests": "counter",
        "d3router_engine_url_ejections": "counter",
        "d3router_engine_url_probes": "counter",
    }
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in families.values()
        for s in family.samples
        if not s.name.endswith("_created")
    }
    a, b = "http://d3-a:8000", "http://d3-b:8000"
    assert samples == {
        ("d3router_engine_url_in_flight", (("url", a),)): 0,
        ("d3router_engine_url_in_flight", (("url", b),)): 0,
        ("d3router_engine_url_healthy", (("url", a),)): 1,
        ("d3router_engine_url_healthy", (("url", b),)): 0,
        ("d3router_engine_url_requests_total", (("result", "ok"), ("url", a))): 4,
        ("d3router_engine_url_requests_total", (("result", "error"), ("url", a))): 0,
        ("d3router_engine_url_requests_total", (("result", "ok"), ("url", b))): 0,
        ("d3router_engine_url_requests_total", (("result", "error"), ("url", b))): 2,
        ("d3router_engine_url_ejections_total", (("url", a),)): 0,
        ("d3router_engine_url_ejections_total", (("url", b),)): 1,
        ("d3router_engine_url_probes_total", (("result", "ok"), ("url", a))): 0,
        ("d3router_engine_url_probes_total", (("result", "error"), ("url", a))): 0,
        ("d3router_engine_url_probes_total", (("result", "ok"), ("url", b))): 0,
        ("d3router_engine_url_probes_total", (("result", "error"), ("url", b))): 0,
    }
    assert calls["a"] == 4


def test_with_two_workers_every_workers_share_is_shown(tmp_path: Path) -> None:
    """`d3router serve --workers 2`: whichever worker answers the scrape, the per-URL series hold both workers'
    calls (each writes its share every second), and health is shown per worker."""
    engine = EngineProcess(tmp_path)
    engine.start()
    dead = f"http://127.0.0.1:{free_port()}"
    config = tmp_path / "router.yaml"
    config.write_text(
        f'engine: {{remote: {{urls: ["{engine.url}", "{dead}"], model: m}}, cache: {{max_entries: 0}}}}\n'
        'upstreams: {chat: {url: "http://127.0.0.1:9/v1"}}\n'
        "policies: {auto: {questions: {j: {type: noul}}, rules: [\n"
        "  {name: guard, when: j < 0.9, block: {status: 403, message: no}}, {name: default, route: chat}]}}\n",
        encoding="utf-8",
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "router", "serve", str(config), "--port", str(port), "--workers", "2"]
    router = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_for(lambda: _answers(f"{url}/healthz"), "the router starts")
        chat = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(20):  # a new connection each, so that both workers take some
            assert httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=30).status_code == 403

        with httpx.Client() as scraper:  # one kept-alive connection: the same worker answers every scrape

            def both_shown() -> bool:
                samples = scrape_url(url, scraper)
                pids = {dict(labels).get("pid") for name, labels in samples if name == "d3router_engine_url_healthy"}
                return ok_calls(samples, engine.url) >= 20 and len(pids) == 2

            wait_for(both_shown, "both workers' shares")
            samples = scrape_url(url, scraper)
        assert ok_calls(samples, engine.url) <= 20 + 4  # and each worker's readiness probes at most
        assert samples[("d3router_engine_url_requests_total", (("result", "error"), ("url", dead)))] >= 2
    finally:
        router.send_signal(signal.SIGINT)
        try:
            router.wait(30)
        except subprocess.TimeoutExpired:
            router.kill()
            router.wait()
        engine.kill()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_check_shows_urls_without_credentials(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "router.yaml"
    config.write_text(
        'engine: {remote: {urls: ["http://alice:hunter2@d3-a:8000", "http://d3-b:8000"]}}\n'
        'upstreams: {chat: {url: "https://bob:s3cret@llm.example/v1"}}\n'
        "policies: {auto: {rules: [{name: default, route: chat}]}}\n",
        encoding="utf-8",
    )
    assert main(["check", str(config)]) == 0
    out = capsys.readouterr().out
    assert "engine: remote http://d3-a:8000, http://d3-b:8000 (" in out and "chat (https://llm.example/v1)" in out
    assert not {"alice", "hunter2", "bob", "s3cret"} & set(out.replace("/", " ").replace(":", " ").split())
