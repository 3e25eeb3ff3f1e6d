"""`d3router check`, `test` and `schema`: outputs and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from router._cli.main import config_schema, main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

VALID = """upstreams:
  small: {url: http://127.0.0.1:8001/v1}
policies:
  auto:
    questions:
      jailbreak: {type: noul}
      unused: {type: noul}
    rules:
      - {name: guard, when: jailbreak > 0.9, block: {status: 403, message: no}}
      - {name: default, route: small}
    tests:
      - {name: blocks, answers: {jailbreak: 0.95}, expect: {rule: guard}}
      - {answers: {jailbreak: 0.1}, expect: {route: small}}
"""


def write(tmp_path: Path, text: str, name: str = "router.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_check_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = write(tmp_path, VALID)
    assert main(["check", file]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"{file}: valid",
        "  engine: embedded vllm-sr/d3-mini (cache 10000 entries, 600 s)",
        "  upstreams: small (http://127.0.0.1:8001/v1)",
        "  policy 'auto': asks 1 (jailbreak), 2 rules, 2 tests; on engine error: route small",
    ]
    assert err.splitlines() == [
        f"warning: {file}:7:7: policies.auto.questions.unused: question 'unused' is not used by any rule;"
        " it will not be asked"
    ]


def test_check_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = write(tmp_path, VALID.replace("jailbreak > 0.9", "jailbrake > 0.9").replace("route: small}", "route: smal}"))
    assert main(["check", file]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"error: {file}:9:23: policies.auto.rules[0].when: rule 'guard': unknown question 'jailbrake'; expected one of"
        " 'jailbreak', 'unused' (did you mean 'jailbreak'?)",
        "    jailbrake > 0.9",
        "    ^",
        f"error: {file}:10:25: policies.auto.rules[1].route: unknown upstream 'smal'; expected one of 'small'"
        " (see `upstreams`)",
        f"{file}: invalid (2 errors)",
    ]


def test_check_remote_engine_without_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = write(tmp_path, "engine: {remote: {urls: [http://a:1]}, cache: {max_entries: 0}}\n" + VALID)
    assert main(["check", file]) == 0
    assert "  engine: remote http://a:1 (no cache)" in capsys.readouterr().out.splitlines()


def test_check_block_on_engine_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = write(tmp_path, VALID.replace("  auto:\n", "  auto:\n    on_engine_error: {block: {status: 403}}\n"))
    assert main(["check", file]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("on engine error: block 403")


def test_test_passing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = write(tmp_path, VALID)
    assert main(["test", file]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"PASS {file}:12 auto #1 'blocks'",
        f"PASS {file}:13 auto #2",
        "policy tests: 2 passed, 0 failed",
    ]


def test_test_failing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = write(tmp_path, VALID.replace("expect: {route: small}", "expect: {rule: guard}"))
    assert main(["test", file]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"PASS {file}:12 auto #1 'blocks'",
        f"FAIL {file}:13 auto #2: expected rule 'guard', got 'default'; trace: guard (no), default",
        "policy tests: 1 passed, 1 failed",
    ]


def test_test_invalid_and_valid_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, VALID)
    bad = write(tmp_path, "upstreams: {}\nupstreams: {}\n", "bad.yaml")
    assert main(["test", bad, good]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "policy tests: 2 passed, 0 failed"
    assert err.splitlines() == [
        f"error: {bad}:2:1: upstreams: duplicate key 'upstreams' (first at line 1); keep one",
        f"{bad}: invalid (1 error)",
        f"warning: {good}:7:7: policies.auto.questions.unused: question 'unused' is not used by any rule;"
        " it will not be asked",
    ]


def test_test_without_cases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = write(tmp_path, "upstreams: {small: {url: http://a}}\n")
    assert main(["test", file]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{file}: no test cases", "policy tests: 0 passed, 0 failed"]


def test_schema_is_json_schema_and_committed_copy_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == config_schema()
    assert printed["title"] == "d3-router configuration"
    assert set(printed["properties"]) == {"server", "engine", "upstreams", "policies"}
    committed = json.loads((REPO / "examples" / "d3router.schema.json").read_text(encoding="utf-8"))
    assert committed == printed, "run `d3router schema > examples/d3router.schema.json`"


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: d3router" in capsys.readouterr().err


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_examples_check_and_test(example: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(example)]) == 0
    assert main(["test", str(example)]) == 0
    out, err = capsys.readouterr()
    assert "FAIL" not in out
    assert err == ""  # no warnings in what users copy from


def test_console_script_runs_as_a_module() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "router", "check", str(EXAMPLES[0])], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{EXAMPLES[0]}: valid")


def test_make_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["make-model", str(tmp_path / "tiny")]) == 0
    assert (
        capsys.readouterr().out
        == f"{tmp_path / 'tiny'}: tiny Qwen3 model built (random weights: its answers carry no meaning)\n"
    )
    assert (tmp_path / "tiny" / "model.safetensors").is_file()


def test_check_decisions_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = write(tmp_path, "engine: {decisions: {url: 'https://k:s@luna.test/v1', model: gpt-6-luna}}\n" + VALID)
    assert main(["check", file]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "  engine: decisions https://luna.test/v1 gpt-6-luna (cache 10000 entries, 600 s)" in out  # no credentials
