"""Decision engines behind one protocol: typed questions in, probabilities out."""

from d3backend._types import (
    D3_MAX_OPTIONS,
    GENERATIVE_MAX_OPTIONS,
    MAX_QUESTIONS,
    MAX_SCORE_LEVELS,
    MIN_SCORE_LEVELS,
    Answer,
    Choice,
    ChoiceAnswer,
    Decided,
    Noul,
    NoulAnswer,
    Question,
    Score,
    ScoreAnswer,
    Usage,
)

__all__ = [
    "D3_MAX_OPTIONS",
    "GENERATIVE_MAX_OPTIONS",
    "MAX_QUESTIONS",
    "MAX_SCORE_LEVELS",
    "MIN_SCORE_LEVELS",
    "Answer",
    "Choice",
    "ChoiceAnswer",
    "Decided",
    "Noul",
    "NoulAnswer",
    "Question",
    "Score",
    "ScoreAnswer",
    "Usage",
]
