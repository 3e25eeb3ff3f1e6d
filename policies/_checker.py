"""What the loader's checks share: the validated file, where each of its paths is, and the problems found so far."""

from __future__ import annotations

from policies._errors import Issue, Path
from policies._issues import locate
from policies._schema import ConfigSpec
from policies._yaml import Marks


class Checker:
    """Collects a configuration's problems as `Issue`s at the file's line and column (warnings apart)."""

    def __init__(self, spec: ConfigSpec, marks: Marks, file: str) -> None:
        self.spec = spec
        self.marks = marks
        self.file = file
        self.issues: list[Issue] = []
        self.warnings: list[Issue] = []

    def line(self, path: Path) -> int | None:
        return locate(path, self.marks)[0]

    def issue(self, path: Path, message: str, *, warning: bool = False) -> None:
        line, column = locate(path, self.marks)
        (self.warnings if warning else self.issues).append(Issue(self.file, line, column, path, message))
