"""The OpenAI Agents SDK (openai-agents, pinned in the test extra) through `d3router serve` (issue 26.4): a run
that chains its turns with `previous_response_id`, streamed or with a gzip-encoded answer, keeps its route."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from tests.agents import _scripted
from tests.agents.conftest import Stack

pytestmark = pytest.mark.anyio


@function_tool
def read_file(path: str) -> str:
    """Read a text file."""
    return Path(path).read_text()


@pytest.fixture
def hard_once() -> Iterator[None]:
    """The engine finds only the opening hard: the tool-result turn, decided alone, would go to the small model."""
    set_tracing_disabled(True)  # the SDK's exporter would send traces out, from a thread of its own
    _scripted.HARD_ONCE[0] = True
    try:
        yield
    finally:
        _scripted.HARD_ONCE[0] = _scripted.GZIP[0] = False


@pytest.mark.parametrize("how", ["streamed", "gzip"])
async def test_a_previous_response_id_run_stays_sticky(stack: Stack, hard_once: None, how: str) -> None:
    _scripted.GZIP[0] = how == "gzip"
    notes = stack.work / "notes.txt"
    notes.write_text("the answer is 42\n")
    async with AsyncOpenAI(base_url=f"{stack.url}/v1", api_key="dummy", max_retries=0) as client:
        agent = Agent(name="reader", instructions="Answer from the file.", tools=[read_file],
                      model=OpenAIResponsesModel(model="gpt-5.1", openai_client=client))  # fmt: skip
        prompt = f"A HARD task: READ {notes}"
        if how == "streamed":
            streamed = Runner.run_streamed(agent, prompt, auto_previous_response_id=True)
            async for _ in streamed.stream_events():
                pass
            final = streamed.final_output
        else:
            final = (await Runner.run(agent, prompt, auto_previous_response_id=True)).final_output
    assert "the answer is 42" in str(final)
    turns = stack.upstream.generations()
    assert len(turns) == 2
    assert turns[1].body.get("previous_response_id") and "input" in turns[1].body
    assert bool(turns[0].body.get("stream")) is (how == "streamed")
    if how == "gzip":
        assert "gzip" in turns[0].headers.get("accept-encoding", "")
    assert [turn.body["model"] for turn in turns] == ["big-model", "big-model"]
