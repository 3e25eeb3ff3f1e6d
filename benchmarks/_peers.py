"""The peers `python -m benchmarks.router --peers` sets d3-router against (issue 15.4), in the same run and layout.

- nginx (Debian's package): the floor of a proxy hop. One worker process, `proxy_pass` to the fake upstream over
  keep-alive upstream connections, `proxy_buffering off` so that streams pass as they come; no access log.
- LiteLLM proxy (`litellm[proxy]`): one uvicorn worker, no database, a `model_list` whose one model, `auto` (what
  the load generator asks for), is an OpenAI-compatible `openai/auto` at the fake upstream's `api_base`. It runs
  from a venv of its own (.venv-peers/): its pins would fight the project's. LiteLLM 1.108.7 will not start
  without a master key unless `LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY=true`, which is set; its model
  cost map is the one it ships (`LITELLM_LOCAL_MODEL_COST_MAP`), never fetched.

Both are optional and installed by `bash benchmarks/install-peers.sh`, never by the tests or CI; without them,
`--peers` stops with a message naming that script. Each peer is pinned to core 1, as the router is.

    peers = Peers(work)                    # raises PeerMissing, naming the install script, if one is not installed
    argv, env = peers.nginx(port, upstream)
    argv, env = peers.litellm(port, upstream)
    lines = vs_d3router(rows)              # fills "rps vs d3router" on each peer's row; a summary line per peer
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parents[1]
INSTALL = "bash benchmarks/install-peers.sh"
VENV = Path(os.environ.get("D3_PEERS_VENV") or REPO / ".venv-peers")  # LiteLLM's own venv (the variable: tests)
BASE = "d3router cache hit"  # the row each peer is set against (the streamed peers against its streamed row)
NAMES = ("nginx", "litellm proxy")
COLUMN = "rps vs d3router"
TARGET = 0.4  # issue 15.4: d3router's cache-hit requests/s at least 0.4x nginx's, at c=1, 8 and 64


class PeerMissing(RuntimeError):
    """A peer is not installed: the message says what is missing and the command that installs it."""


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).is_file()), None)


def litellm_binary(venv: Path = VENV) -> Path | None:
    path = venv / "bin" / "litellm"
    return path if path.is_file() else None


def nginx_config(work: Path, port: int, upstream: str, *, as_root: bool) -> str:
    """nginx's whole config: one worker, listening on `port`, passing everything to `upstream`'s host over
    keep-alive connections without buffering; its pid, logs and temporary files in `work`."""
    parts = urlsplit(upstream)
    user = "user root;\n" if as_root else ""  # as root, its worker would be `nobody`, who cannot write to `work`
    temp = "".join(f"    {kind}_temp_path {work / kind};\n" for kind in ("client_body", "proxy", "fastcgi", "uwsgi",
                                                                           "scgi"))  # fmt: skip
    return f"""{user}worker_processes 1;
daemon off;
pid {work / "nginx.pid"};
error_log {work / "error.log"} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
{temp}    upstream fake {{
        server {parts.hostname}:{parts.port};
        keepalive 128;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port};
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://fake;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


def litellm_config(upstream: str, model: str = "auto") -> str:
    """LiteLLM proxy's config (JSON is YAML): `model` served by `upstream` as an OpenAI-compatible model."""
    config = {
        "model_list": [{"model_name": model, "litellm_params": {"model": f"openai/{model}", "api_base": upstream,
                                                                "api_key": "bench"}}],
        "litellm_settings": {"telemetry": False, "drop_params": True},
        "general_settings": {},
    }  # fmt: skip
    return json.dumps(config, indent=2) + "\n"


LITELLM_ENV = {
    "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",  # no master key: 1.108.7 refuses to start without
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the cost map it ships; never fetched
    "LITELLM_LOG": "ERROR",
    "DISABLE_ADMIN_UI": "True",
}


class Peers:
    """Where the peers' configs go (`work`) and how each is started; raises `PeerMissing` if one is missing."""

    def __init__(self, work: Path, venv: Path = VENV, nginx: str | None = None) -> None:
        missing = []
        self.nginx_path = nginx or nginx_binary()
        self.litellm_path = litellm_binary(venv)
        if self.nginx_path is None:
            missing.append("nginx (Debian's package)")
        if self.litellm_path is None:
            missing.append(f"LiteLLM proxy (in {venv})")
        if missing:
            raise PeerMissing(f"--peers: {' and '.join(missing)} not installed; install the peers with `{INSTALL}` "
                              "(optional: the tests never need them)")  # fmt: skip
        self.work = work
        work.mkdir(parents=True, exist_ok=True)  # only once every peer is found

    def nginx(self, port: int, upstream: str, as_root: bool) -> tuple[list[str], dict[str, str]]:
        folder = self.work / f"nginx-{port}"
        folder.mkdir(parents=True)
        (folder / "nginx.conf").write_text(nginx_config(folder, port, upstream, as_root=as_root), encoding="utf-8")
        assert self.nginx_path is not None
        return [
            self.nginx_path,
            "-p",
            str(folder),
            "-c",
            str(folder / "nginx.conf"),
            "-e",
            str(folder / "error.log"),
        ], {}

    def litellm(self, port: int, upstream: str) -> tuple[list[str], dict[str, str]]:
        config = self.work / f"litellm-{port}.yaml"
        config.write_text(litellm_config(upstream), encoding="utf-8")
        argv = [str(self.litellm_path), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                "--num_workers", "1"]  # fmt: skip
        return argv, dict(LITELLM_ENV)


def vs_d3router(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Fill each peer's row with its requests/s over d3router's cache-hit row's at the same concurrency; return a
    summary line per peer (plain and streamed): d3router's requests/s as a share of the peer's, errors said."""
    by_name = {(row["target"], row["concurrency"]): row for row in rows}
    found: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        name = row["target"]
        stream = name.startswith("stream, ")
        if name.removeprefix("stream, ") not in NAMES:
            continue
        base = by_name.get(("stream, " * stream + BASE, row["concurrency"]))
        if base is None or not row["rps"] or not base["rps"]:
            continue
        row[COLUMN] = row["rps"] / base["rps"]
        found.setdefault(name, []).append((row["concurrency"], base["rps"] / row["rps"]))
    lines = {}
    for name, shares in found.items():
        ours = "stream, " * name.startswith("stream, ") + BASE
        levels = "/".join(str(level) for level, _ in shares)
        errors = sum(row["errors"] for row in rows if row["target"] == name)
        line = f"{ours} requests/s over {name}'s at c={levels}: x {', '.join(f'{s:.2f}' for _, s in shares)}"
        if name == "nginx":
            line += f"; target >= {TARGET} at each ({'met' if all(s >= TARGET for _, s in shares) else 'MISSED'})"
        lines[name] = line + (f"; {name} had {errors} errors (see its rows)" if errors else "")
    return lines
