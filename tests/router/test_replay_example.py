"""`--against` on the example traffic (issue 13): a one-threshold edit of examples/replay.yaml lists exactly the
requests whose decision changed, checked against the two policies evaluated line by line on the same answers."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from d3backend import FakeEngine, JSONValue, Question, answer_from
from policies import load_config, parse_config
from router import CHAT, MediaRules, read_traffic, replay, summarize

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def answers(state: JSONValue, questions: Mapping[str, Question]) -> dict[str, Any]:
    """Answers fixed by the text: a spread of difficulties around the threshold the edit moves."""
    digest = hashlib.blake2b(str(state).encode(), digest_size=4).digest()
    table = {"jailbreak": digest[0] / 255 * 0.5, "injection": digest[1] / 255 * 0.5,
             "kind": ("code", "math", "chat")[digest[2] % 3], "difficulty": digest[3] / 255 * 3}  # fmt: skip
    return {qid: table[qid] for qid in questions}


def test_a_one_threshold_edit_lists_exactly_the_changed_requests(tmp_path: Path) -> None:
    text = (EXAMPLES / "replay.yaml").read_text(encoding="utf-8")
    assert text.count("difficulty >= 1.5") == 1
    old = load_config(EXAMPLES / "replay.yaml")
    new = parse_config(text.replace("difficulty >= 1.5", "difficulty >= 2.0"), str(EXAMPLES / "replay-v2.yaml"))
    traffic = str(EXAMPLES / "traffic.jsonl")
    lines, bad = read_traffic(traffic, old)
    assert not bad and len(lines) >= 50
    before = asyncio.run(replay(old, lines, engine=FakeEngine(answers), concurrency=8))
    after = asyncio.run(replay(new, lines, engine=FakeEngine(answers), concurrency=8))
    changed = summarize(old, before, against=(new, after))["changed"]

    expected = []  # the same answers through both policies, without the replay machinery
    policy_old, policy_new = old.policies["auto"], new.policies["auto"]
    for line in lines:
        state = CHAT.state(line.body, policy_old.state, MediaRules())
        raw = answers(state.state, policy_old.questions)
        parsed = {qid: answer_from(policy_old.questions[qid], value) for qid, value in raw.items()}
        a, b = policy_old.evaluate(parsed).rule, policy_new.evaluate(parsed).rule
        if a != b:
            expected.append({"line": line.line, "old": a, "new": b})
    assert expected, "the edit should change some decisions on the example traffic"
    assert changed["lines"] == expected
    assert changed["count"] == len(expected)
    assert changed["pairs"] == {"hard-work -> default": len(expected)}


def test_a_model_no_policy_names_is_decided_by_the_default_policy_as_the_router_does(tmp_path: Path) -> None:
    text = (EXAMPLES / "replay.yaml").read_text(encoding="utf-8")
    # The example is closed itself now (issue 25.2: every shipped example sets server.default_policy), so the
    # setting the test used to prepend is the file's own.
    config = parse_config(text, str(EXAMPLES / "replay.yaml"))
    assert config.server.default_policy == "auto"
    traffic = tmp_path / "traffic.jsonl"
    traffic.write_text('{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}\n', encoding="utf-8")
    lines, bad = read_traffic(str(traffic), config)
    assert not bad
    [outcome] = asyncio.run(replay(config, lines, engine=FakeEngine(answers)))
    assert (outcome.policy, outcome.action) == ("auto", "route")
