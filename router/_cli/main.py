"""The `d3router` command.

d3router check FILE      validate a configuration and print a short summary   (exit 0, or 2 if invalid)
d3router test FILE...    run the policy test cases in the files               (exit 0; 1 if any fail; 2 if invalid)
d3router explain FILE BODY   decide one request body as the router would (no upstream called), print JSON
d3router schema          print the configuration's JSON Schema, for editors
d3router replay CONFIG TRAFFIC      decide traffic and report what the policies do    (exit 1: a gate missed)
d3router calibrate CONFIG TRAFFIC   a rule's threshold from labelled traffic          (exit 1: no threshold fits)
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from d3backend import make_model, redact_url
from policies import Block, Config, ConfigError, ConfigSpec, Route, load_config, reference_markdown, run_test

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_INVALID
    try:
        code: int = args.run(args, sys.stdout, sys.stderr)
        sys.stdout.flush()
    except BrokenPipeError:  # `d3router ... | head`: the reader left; stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's own flush must not fail
        return EXIT_FAILED
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="d3router", description="Semantic routing for OpenAI-compatible chat APIs.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the router in front of the configured upstreams")
    serve.add_argument("file")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--workers", type=int, default=1, help="processes (remote engine only); default 1")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--log-format", default="text", choices=["text", "json"],
                       help="json: one JSON object per line on stderr, for log shippers (default: text)")  # fmt: skip
    serve.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=None,
                       help="one line per request (default: on with --log-format json, off with text)")  # fmt: skip
    serve.set_defaults(run=_serve)
    check = commands.add_parser("check", help="validate a configuration file and summarize it")
    check.add_argument("file")
    check.set_defaults(run=_check)
    test = commands.add_parser("test", help="run the policy test cases of configuration files")
    test.add_argument("files", nargs="+", metavar="FILE")
    test.set_defaults(run=_test)
    explain = commands.add_parser("explain", help="decide a request body as the router would, calling no upstream")
    explain.add_argument("file")
    explain.add_argument("body", help="a JSON request body of any decided API, or - for standard input")
    explain.add_argument(
        "--api", choices=["chat", "completions", "responses", "messages"],
        help="the body's API (default: guessed from its fields, as POST /v1/d3/explain does)",
    )  # fmt: skip
    explain.set_defaults(run=_explain)
    schema = commands.add_parser("schema", help="print the configuration file's JSON Schema")
    schema.add_argument("--markdown", action="store_true", help="print the reference page (docs/configuration.md)")
    schema.set_defaults(run=_schema)
    make = commands.add_parser("make-model", help="build the tiny local model for tests and offline demos")
    make.add_argument("directory")
    make.add_argument("--seed", type=int, default=0)
    make.set_defaults(run=_make_model)
    from router._offline.commands import add_parsers

    add_parsers(commands)
    return parser


def _load(file: str, err: TextIO) -> Config | None:
    try:
        config = load_config(file)
    except ConfigError as exc:
        for issue in exc.issues:
            print(f"error: {issue}", file=err)
        count = len(exc.issues)
        print(f"{file}: invalid ({count} error{'s' if count != 1 else ''})", file=err)
        return None
    for warning in config.warnings:
        print(f"warning: {warning}", file=err)
    return config


def _serve(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from router._faces.serve import run, serve, serve_workers
    from router._observe import logs, tracing
    from router._sessions.session import SaltMissing

    # Applied when serving starts (router._faces.serve), or at once for JSON, whose every line must be JSON.
    log_config = logs.log_config(args.log_format, args.log_level, args.access_log)
    if args.log_format == "json":  # the configuration's errors and warnings as JSON lines too
        logs.apply(log_config)
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # an embedded vLLM's lines through ours
        buffer = io.StringIO()
        config = _load(args.file, buffer)
        _log_lines(buffer.getvalue())
    else:
        config = _load(args.file, err)
    if config is None:
        return EXIT_INVALID
    if args.workers == 1:
        logs.apply(log_config)  # (the supervisor of workers applies it after its own checks)
    try:
        tracing.check() if args.workers > 1 else tracing.configure()  # each worker configures its own
    except ValueError as exc:  # an OTEL_* variable d3router cannot follow
        logging.getLogger("router").error("%s", exc)
        return EXIT_INVALID
    if args.workers > 1:
        return serve_workers(config, args.host, args.port, args.workers, log_level=args.log_level,
                             log_config=log_config)  # fmt: skip
    try:
        return run(serve(config, args.host, args.port, log_level=args.log_level, log_config=log_config))
    except KeyboardInterrupt:
        return EXIT_OK
    except (SaltMissing, ConfigError) as exc:  # the salt Redis needs, a keys file: the fix is in the message
        logging.getLogger("router").error("d3router cannot start: %s", exc)
        return EXIT_INVALID
    finally:
        tracing.shutdown()


def _log_lines(text: str) -> None:
    log = logging.getLogger("router")
    for line in text.splitlines():
        if line.startswith("error: "):
            log.error("%s", line.removeprefix("error: "))
        elif line.startswith("warning: "):
            log.warning("%s", line.removeprefix("warning: "))
        elif line:
            log.error("%s", line)


def _check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    config = _load(args.file, err)
    if config is None:
        return EXIT_INVALID
    engine = config.engine
    if engine.pool is not None:
        where = "pool " + ", then ".join(f"{member.label} ({member.kind})" for member in engine.pool)
    elif engine.decisions is not None:
        where = f"decisions {redact_url(engine.decisions.url)} {engine.decisions.model}"
    elif engine.remote is not None:
        where = f"remote {', '.join(redact_url(url) for url in engine.remote.urls)}"
    else:
        where = f"embedded {(engine.embedded.model if engine.embedded else 'vllm-sr/d3-mini')}"
    cache = "no cache"
    if engine.cache.max_entries:
        cache = f"cache {engine.cache.max_entries} entries, {engine.cache.ttl_s:g} s"
    print(f"{config.file}: valid", file=out)
    print(f"  engine: {where} ({cache})", file=out)
    print(
        "  upstreams: "
        + ", ".join(f"{name} ({redact_url(up.url)}{f', speaks {up.api}' if up.api else ''})"
                    for name, up in config.upstreams.items()),
        file=out,
    )  # fmt: skip
    for name, policy in config.policies.items():
        asked = ", ".join(policy.questions) or "none"
        tests = sum(1 for test in config.tests if test.policy == name)
        action = policy.on_engine_error.action
        fallback = f"route {' -> '.join(action.upstreams)}" if isinstance(action, Route) else ""
        if isinstance(action, Block):
            fallback = f"block {action.status}"
        print(
            f"  policy {name!r}: asks {len(policy.questions)} ({asked}), {len(policy.rules)} rules, {tests} tests;"
            f" on engine error: {fallback}",
            file=out,
        )
        guard = policy.answer
        if guard is not None:
            print(
                f"    answer guard: reads {guard.read}, asks {len(guard.questions)} ({', '.join(guard.questions)}),"
                f" {len(guard.rules)} rules; on engine error: {guard.on_engine_error}",
                file=out,
            )
    return EXIT_OK


def _test(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    passed = failed = 0
    invalid = False
    for file in args.files:
        config = _load(file, err)
        if config is None:
            invalid = True
            continue
        if not config.tests:
            print(f"{file}: no test cases", file=out)
        for test in config.tests:
            result = run_test(config.policies[test.policy], test)
            where = f"{file}:{test.line}" if test.line else file
            if result.passed:
                passed += 1
                print(f"PASS {where} {test.label}", file=out)
            else:
                failed += 1
                print(f"FAIL {where} {test.label}: {result.message}", file=out)
    print(f"policy tests: {passed} passed, {failed} failed", file=out)
    if invalid:
        return EXIT_INVALID
    return EXIT_FAILED if failed else EXIT_OK


def _explain(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """`POST /v1/d3/explain`'s twin: the state, answers and rule trace for one body, with the configured engine."""
    config = _load(args.file, err)
    if config is None:
        return EXIT_INVALID
    import asyncio
    from pathlib import Path

    from router._apis.body import parse_json
    from router._apis.registry import detect
    from router._decision.engines import build_engine, start_engine
    from router._decision.judge import answer_explainer
    from router._decision.service import RouterService
    from router._errors import BadRequest

    try:
        raw = sys.stdin.buffer.read() if args.body == "-" else Path(args.body).read_bytes()
        body = parse_json(raw)
        api = detect({key: value for key, value in body.items() if key != "d3_answer"}, args.api)
    except OSError as exc:
        print(f"error: cannot read {args.body}: {exc.strerror or exc}", file=err)
        return EXIT_INVALID
    except BadRequest as exc:
        print(f"error: {args.body}: {exc.message}", file=err)
        return EXIT_INVALID

    async def run() -> dict[str, object]:
        needs = config.asks
        engine = build_engine(config.engine, base_dir=Path(config.file).parent, environ=os.environ) if needs else None
        try:
            await start_engine(engine)
            service = RouterService(config, engine)
            request, answer = answer_explainer(service, body, api.name)
            return await service.explain(request, api, answer=answer)
        finally:
            if engine is not None:
                await engine.aclose()

    try:
        payload = asyncio.run(run())
    except BadRequest as exc:
        print(f"error: {args.body}: {exc.message}", file=err)
        return EXIT_FAILED
    print(json.dumps(payload, indent=2, ensure_ascii=False), file=out)
    return EXIT_OK


def _schema(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.markdown:
        out.write(reference_markdown(config_schema()))
        return EXIT_OK
    print(json.dumps(config_schema(), indent=2), file=out)
    return EXIT_OK


def _make_model(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    path = make_model(args.directory, seed=args.seed)
    print(f"{path}: tiny Qwen3 model built (random weights: its answers carry no meaning)", file=out)
    return EXIT_OK


def config_schema() -> dict[str, object]:
    """The JSON Schema of a configuration file (what `d3router schema` prints)."""
    schema = ConfigSpec.model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema, "title": "d3-router configuration"}
