"""The offline demo: d3-router with an embedded engine and a local upstream, all on this machine.

    bash .ci/setup && .venv/bin/python examples/quickstart.py

1. builds the tiny model (`.d3router/tiny-model`; its answers mean nothing, production uses vllm-sr/d3-mini),
2. starts a vLLM chat server of that model on 127.0.0.1:8001 as the upstream (its text means nothing either),
3. runs `d3router serve examples/quickstart.yaml` on 127.0.0.1:8080 with the engine embedded in the router.

Then, from another terminal:

    curl -si http://127.0.0.1:8080/v1/chat/completions -H 'content-type: application/json' \\
      -d '{"model": "auto", "messages": [{"role": "user", "content": "Fix my Python loop"}]}'

Ctrl-C stops the router and the upstream.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from d3backend import VllmServer, make_model  # noqa: E402
from policies import ConfigError, load_config  # noqa: E402
from router._faces.serve import run, serve  # noqa: E402

WORK = REPO / ".d3router"


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(REPO / "examples" / "quickstart.yaml")
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    model = make_model(WORK / "tiny-model")
    print(f"quickstart: built the tiny model in {model} (its answers carry no meaning)", flush=True)
    # vLLM keeps Responses answers only when told to: then `previous_response_id` chains work end to end (and the
    # router keeps such a chain on its session's upstream).
    os.environ.setdefault("VLLM_ENABLE_RESPONSES_API_STORE", "1")
    upstream = VllmServer(model, served_model_name="d3-tiny", port=8001, workdir=WORK / "upstream")
    print("quickstart: starting the upstream, a vLLM chat server of the tiny model on :8001 (~30 s)", flush=True)
    upstream.start()
    try:
        print("quickstart: starting d3router on http://127.0.0.1:8080 with the engine embedded (~30 s)", flush=True)
        return run(serve(config, "127.0.0.1", 8080))
    except KeyboardInterrupt:
        return 0
    finally:
        upstream.stop()


if __name__ == "__main__":
    sys.exit(main())
