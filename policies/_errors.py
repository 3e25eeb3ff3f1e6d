"""Errors of the policy language.

    PolicyError
     ├── ConfigError          the file is not a valid configuration (carries every issue found)
     └── EvaluationError      evaluating a policy needed an answer it was not given

Each `Issue` names the file, the line and column, the offending key path, and what was expected, so a user can
fix the file without reading code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Path = tuple[str | int, ...]


class PolicyError(Exception):
    """Root of the errors raised by `policies`."""


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem in a configuration file."""

    file: str
    line: int | None
    column: int | None
    path: Path
    message: str

    @property
    def key(self) -> str:
        """The offending key as a dotted path, e.g. `policies.auto.rules[1].when`."""
        return format_path(self.path)

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        key = f" {self.key}:" if self.path else ""
        return f"{where}:{key} {self.message}"


class ConfigError(PolicyError):
    """The configuration is invalid; `issues` lists every problem found, in file order."""

    def __init__(self, issues: Sequence[Issue]) -> None:
        self.issues = tuple(issues)
        super().__init__("\n".join(str(issue) for issue in self.issues))


class EvaluationError(PolicyError):
    """A policy was evaluated without an answer one of its conditions needs."""


def format_path(path: Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
