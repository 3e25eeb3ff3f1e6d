"""Shadow policies: another policy evaluated on the same request and answers, never acted on (issue 13).

    shadows = Shadows(metrics)
    decision = shadows.consider(d3, config, engine, request_id, write_log_line)   # None: decided later, or none

With every question the shadow reads asked already (the same ids and the same questions) it costs no engine call
and its decision comes back at once; otherwise its own questions are asked after the response, in the background
(at most `MAX_SHADOW_TASKS` at once; more are not compared, never queued), and its decision is logged on a line of
its own. `/metrics` counts agreement per rule pair.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from d3backend import DecisionEngine, EngineError, Question
from policies import Config, Decision, Policy
from router._decision.record import D3Decision, agrees, decision_json
from router._observe.metrics import Counts, Metrics

logger = logging.getLogger(__name__)

MAX_SHADOW_TASKS = 64


class Shadows:
    def __init__(self, metrics: Metrics) -> None:
        self.decisions: Counts[tuple[str, str, str, str, str]] = metrics.counter(
            "d3router_shadow_decisions",
            "Shadow policies' decisions beside the live ones, by rule pair and whether their actions agree.",
            ("policy", "rule", "shadow", "shadow_rule", "agree"),
        )
        self.engine_calls: Counts[str] = metrics.counter(
            "d3router_shadow_engine_calls",
            "Engine calls made for a shadow policy's own questions (none when the live policy asked them), by shadow.",
            ("shadow",),
        )
        self.pending: set[asyncio.Task[None]] = set()

    def consider(
        self, d3: D3Decision, config: Config, engine: DecisionEngine | None, request_id: str,
        log: Callable[[dict[str, Any]], None],
    ) -> Decision | None:  # fmt: skip
        """The shadow's decision on `d3`'s answers, counted; None when it needs questions of its own (then asked
        in the background and logged through `log`) or the live policy has no shadow."""
        policy = config.policies[d3.policy]
        shadow = config.policies.get(policy.shadow or "")
        if shadow is None:
            return None
        live = policy.questions
        missing = {qid: q for qid, q in shadow.questions.items() if qid not in d3.answers or live.get(qid) != q}
        if not missing:
            decision = shadow.evaluate(d3.answers, d3.facts)
            self._count(d3, decision)
            return decision
        if engine is not None and len(self.pending) < MAX_SHADOW_TASKS:
            later = self._later(d3, shadow, missing, engine, config.server.decision_timeout_s, request_id, log)
            task = asyncio.get_running_loop().create_task(later)
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)
        return None

    async def _later(
        self, d3: D3Decision, shadow: Policy, missing: Mapping[str, Question], engine: DecisionEngine,
        timeout_s: float, request_id: str, log: Callable[[dict[str, Any]], None],
    ) -> None:  # fmt: skip
        state = d3.state
        self.engine_calls[shadow.name] += 1
        try:
            async with asyncio.timeout(timeout_s):
                decided = await engine.decide(state.state, missing, images=state.images, videos=state.videos)
        except (EngineError, TimeoutError) as exc:
            logger.info("shadow policy %r: the engine failed (%s); not compared", shadow.name, exc)
            return
        answers = {**{qid: a for qid, a in d3.answers.items() if qid not in missing}, **decided.answers}
        decision = shadow.evaluate(answers, d3.facts)
        self._count(d3, decision)
        log({"time": round(time.time(), 3), "request_id": request_id, "policy": d3.policy, "rule": d3.decision.rule,
             "shadow": decision_json(decision, agrees(d3.decision, decision))})  # fmt: skip

    def _count(self, d3: D3Decision, decision: Decision) -> None:
        agree = "yes" if agrees(d3.decision, decision) else "no"
        self.decisions[(d3.policy, d3.decision.rule, decision.policy, decision.rule, agree)] += 1

    async def aclose(self) -> None:
        """Cancel the shadow decisions still being asked, and wait for them (the app's shutdown)."""
        tasks = list(self.pending)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
