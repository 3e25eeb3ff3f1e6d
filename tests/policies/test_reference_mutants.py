"""The configuration reference at its edges: the committed page is the models' rendering, and the words, anchors and
sections of schemas the configuration does not (yet) hold. Pinned where mutmut found a change no test of its
selection noticed (issue 23)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from policies import ConfigSpec, reference_markdown
from tests.policies.test_reference import rows

PAGE = Path(__file__).parents[2] / "docs" / "configuration.md"


def test_the_committed_reference_is_the_rendering_of_the_models() -> None:
    rendered = reference_markdown(ConfigSpec.model_json_schema(by_alias=True))
    assert rendered == PAGE.read_text(encoding="utf-8"), "run `d3router schema --markdown > docs/configuration.md`"
