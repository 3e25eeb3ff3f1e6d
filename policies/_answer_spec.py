"""The configuration of answer guards (issue 27): questions and rules about the upstream's answer, with their
test cases; compiled by `policies/_answer.py`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from d3backend import MAX_QUESTIONS
from policies._specs import QuestionSpec, Tags, _checked_tags
from policies._strict import Strict


class AnswerBlockSpec(Strict):
    """The error the client gets instead of a blocked answer."""

    status: int = Field(403, ge=400, le=599, description="The HTTP status.")
    message: str = Field("The answer was withheld by policy.", description="The error's message.")


class AnswerRuleSpec(Strict):
    """One answer rule: `block` the answer, `replace` it with a text, or only `tag` it."""

    name: str = Field(min_length=1, description="Unique among the answer rules; named in x-d3-answer-rule and logs.")
    when: str | None = Field(None, description="A condition over the answer questions, e.g. leak > 0.8")
    block: AnswerBlockSpec | None = Field(None, description="Withhold the answer: the client gets this error.")
    replace: str | None = Field(
        None, min_length=1, description="Withhold the answer: the client gets an answer with this text instead."
    )
    tag: Tags = Field(default_factory=dict, description="Headers added to the client's response.")

    @field_validator("tag")
    @classmethod
    def _tags(cls, tags: Tags) -> Tags:
        return _checked_tags(tags)

    @model_validator(mode="after")
    def _one_action(self) -> AnswerRuleSpec:
        if self.block is not None and self.replace is not None:
            raise PydanticCustomError("action", "an answer rule either blocks or replaces, not both")
        if self.block is None and self.replace is None and not self.tag:
            raise PydanticCustomError(
                "action", "answer rule {n} does nothing; give it `block`, `replace` or `tag`", {"n": repr(self.name)}
            )
        return self


class AnswerExpectSpec(Strict):
    """What an answer guard's test case checks; only the keys given are checked."""

    rule: str | None = Field(None, description="The answer rule that stops the answer (`-` for none).")
    outcome: Literal["pass", "block", "replace"] | None = Field(None, description="What the client gets.")
    status: int | None = Field(None, description="A block's status.")
    tags: Tags | None = Field(None, description="Tags the verdict adds (the ones given).")
    degraded: bool | None = Field(None, description="Whether on_engine_error decided.")


class AnswerTestSpec(Strict):
    """An answer guard's test case, run by `d3router test`: the engine's answers about an answer in, a verdict out."""

    name: str | None = Field(None, description="Shown beside the case's number in `d3router test`'s output.")
    answers: dict[str, Any] = Field(default_factory=dict, description="Per answer question, as a policy test's.")
    engine_error: bool = Field(False, description="Test what happens when the engine cannot judge.")
    expect: AnswerExpectSpec = Field(description="What the verdict must be.")


class AnswerSpec(Strict):
    """Questions and rules about the upstream's answer, judged before any of it reaches the client."""

    read: Literal["text", "tool_calls", "both"] = Field(
        "both",
        description="What the engine reads of the answer: its text, its tool calls (name and arguments), or both.",
    )
    context: bool = Field(True, description="Give the engine the request's own state beside the answer (the task).")
    max_chars: int = Field(6000, gt=0, description="The answer's budget in the state; the rest is cut, and said so.")
    max_answer_bytes: int = Field(
        1024 * 1024, gt=0, description="The largest answer held to be judged; a larger one is refused (502)."
    )
    window_chars: int = Field(
        1024, gt=0, description="Streams are judged in windows of this much new text, each released once judged."
    )
    overlap_chars: int = Field(
        256,
        ge=0,
        description="The end of the window before, judged again with the next: a marker split across "
        "the edge is read whole.",
    )
    on_engine_error: Literal["block", "pass"] = Field(
        "block", description="When the engine cannot judge the answer: withhold it (503) or let it pass."
    )
    questions: dict[str, QuestionSpec] = Field(
        default_factory=dict, max_length=MAX_QUESTIONS, description="Keyed by id, as a policy's questions."
    )
    rules: list[AnswerRuleSpec] = Field(min_length=1, description="In order; an answer no rule stops passes.")
    tests: list[AnswerTestSpec] = Field(default_factory=list, description="Cases `d3router test` runs.")
