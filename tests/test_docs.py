"""The documentation: the generated configuration reference is current, every relative link and anchor resolves,
every repository path the README names exists, and the README stays a front door (under 16,000 bytes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from policies import parse_config, run_test
from router._cli.main import main

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", REPO / "benchmarks" / "README.md", *(REPO / "docs").glob("*.md")])
README_LIMIT = 16_000

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)
PATH_LIKE = re.compile(r"^\.?[\w.-]+(/[\w.*-]*)*$")
FILE_SUFFIXES = (".md", ".py", ".yaml", ".yml", ".json", ".jsonl", ".toml", ".sh", ".html")


def prose(text: str) -> str:
    """The text outside fenced code blocks, where links and headings live."""
    return FENCE.sub("", text)


def links(page: Path) -> list[str]:
    """The targets of the page's inline links, outside code blocks and code spans."""
    text = CODE_SPAN.sub("code", prose(page.read_text(encoding="utf-8")))
    return LINK.findall(text)


def slug(heading: str) -> str:
    """The id GitHub gives a heading: its text in lower case, punctuation dropped but `-` and `_`, spaces as `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The ids of the page's headings, numbered as GitHub numbers repeated ones (`-1`, `-2`, ...)."""
    seen: dict[str, int] = {}
    ids: set[str] = set()
    for _, heading in HEADING.findall(prose(page.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        ids.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return ids


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not ours to check offline
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no such heading in {resolved.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert links(page), "a page with no links: is the link pattern still right?"
    assert broken_links(page) == []


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Some `code` heading\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md) [ok](other.md#some-code-heading) [ok](other.md#twice-1) [ok](#page) "
        "[ok](https://example.com/missing)\n[gone](missing.md) [no anchor](other.md#nowhere) [self](#nowhere)\n"
        "```\n[in code](ignored.md)\n```\n`[in a span](ignored.md)`\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nowhere: no such heading in other.md",
        "#nowhere: no such heading in page.md",
    ]


def readme_paths() -> list[str]:
    """The repository paths the README names in backticks: a code span that is a path (`examples/`, `.ci/run`,
    `examples/fastapi_app.py`), and in commands and code blocks each word under a top-level folder of the repository
    (`d3router serve examples/quickstart.yaml`). `.venv` is made by `.ci/setup`, not committed."""
    top = {entry.name for entry in REPO.iterdir()} - {".venv", ".git"}
    text = (REPO / "README.md").read_text(encoding="utf-8")
    fenced = [block.group(0) for block in FENCE.finditer(text)]
    spans = [span for _, span in CODE_SPAN.findall(prose(text))]
    found = [span for span in spans if PATH_LIKE.match(span) and (span.endswith(FILE_SUFFIXES) or span in top)]
    for word in " ".join(spans + fenced).split():
        word = word.strip("\"'(),;:")
        if PATH_LIKE.match(word) and "/" in word and word.split("/")[0] in top:
            found.append(word)
    return sorted(set(found))


def test_every_path_the_readme_names_exists() -> None:
    paths = readme_paths()
    assert {"examples/quickstart.yaml", ".ci/setup", ".ci/run", "examples/fastapi_app.py"} <= set(paths)
    assert [path for path in paths if not any(REPO.glob(path.rstrip("/")))] == []


def test_the_readme_is_a_front_door() -> None:
    readme = (REPO / "README.md").read_bytes()
    assert len(readme) < README_LIMIT, f"README.md is {len(readme):,} bytes: move reference text to docs/"
    text = readme.decode("utf-8")
    # CI runs the README's test command (.ci/run), and the quickstart is the other of the two commands.
    assert "```sh\nbash .ci/setup && .venv/bin/python -m pytest\n```" in text
    assert "```sh\nbash .ci/setup && .venv/bin/python examples/quickstart.py\n```" in text
    assert not re.search(r"\(#\d+|\bissues? \d+|#\d+\)", text), "issue numbers belong in commits, not the README"


@pytest.mark.parametrize("page", ["README.md", "docs/policies.md"])
def test_the_policy_example_is_a_valid_policy_whose_tests_pass(page: str) -> None:
    text = (REPO / page).read_text(encoding="utf-8")
    example = re.search(r"^```yaml\n(policies:\n.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert example, f"{page} has no policy example"
    upstreams = "upstreams:\n  small: {url: http://127.0.0.1:8001/v1}\n  large: {url: http://127.0.0.1:8002/v1}\n"
    config = parse_config(upstreams + example.group(1), file=page)
    results = [run_test(config.policies[test.policy], test) for test in config.tests]
    assert results and all(result.passed for result in results)


def test_configuration_reference_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "--markdown"]) == 0
    printed = capsys.readouterr().out
    committed = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == printed, "run `d3router schema --markdown > docs/configuration.md`"
    assert printed.startswith("# Configuration reference\n")
