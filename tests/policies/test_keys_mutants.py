"""Reading a keys file (`policies.load_keys`): its size limit, the errors that name the file (never a key), the
names used twice. Pinned where mutmut found a change no test of the selection noticed (issue 23)."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies import ConfigError
from policies._errors import Issue
from policies._keys import MAX_KEYS_FILE_BYTES, load_keys

KEY = "secret-key-0123456789"


def write(tmp_path: Path, content: str | bytes) -> str:
    path = tmp_path / "keys.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return str(path)


def refused(path: str) -> list[Issue]:
    with pytest.raises(ConfigError) as caught:
        load_keys(path)
    return list(caught.value.issues)


def padded(tail: str, size: int) -> str:
    """A keys file of exactly `size` bytes: a comment line, then `tail` (whose last byte matters to the YAML)."""
    return "#" + "x" * (size - len(tail) - 2) + "\n" + tail


def test_a_keys_file_at_the_limit_is_read_to_its_last_byte(tmp_path: Path) -> None:
    text = padded(f"keys: [{{name: ab, key: {KEY}}}]", MAX_KEYS_FILE_BYTES)
    path = write(tmp_path, text)
    assert len(text.encode()) == MAX_KEYS_FILE_BYTES
    assert [(key.name, key.key) for key in load_keys(path)] == [("ab", KEY)]


def test_a_keys_file_one_byte_over_the_limit_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, padded(f"keys: [{{name: ab, key: {KEY}}}]", MAX_KEYS_FILE_BYTES + 1))
    assert refused(path) == [Issue(path, None, None, (), "the keys file is over 4 MiB")]


def test_a_missing_keys_file_is_one_issue_naming_the_file(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.yaml")
    (issue,) = refused(path)
    assert (issue.file, issue.line, issue.column, issue.path) == (path, None, None, ())
    assert issue.message.startswith("cannot read the keys file: ")
    assert "No such file" in issue.message
    assert str(issue).startswith(f"{path}: cannot read the keys file: ")


def test_a_keys_file_that_is_not_utf8_is_refused_as_unreadable(tmp_path: Path) -> None:
    path = write(tmp_path, b"keys: [{name: a\xff}]\n")
    (issue,) = refused(path)
    assert (issue.file, issue.path) == (path, ())
    assert issue.message.startswith("cannot read the keys file: ")
    assert "utf-8" in issue.message


def test_a_yaml_error_in_a_keys_file_names_that_file(tmp_path: Path) -> None:
    path = write(tmp_path, "keys: [\n")
    (issue,) = refused(path)
    assert issue.file == path
    assert str(issue).startswith(f"{path}:2:1: invalid YAML: ")


def test_a_keys_file_holding_only_null_has_no_keys(tmp_path: Path) -> None:
    assert load_keys(write(tmp_path, "~\n")) == ()


def test_a_bad_entry_is_placed_at_its_line_and_column_and_leaves_its_value_out(tmp_path: Path) -> None:
    # A key given as a number: the value may be the key itself, so the message stops before ", found ...".
    path = write(tmp_path, "keys:\n  - {name: a, key: 1234567890123456789}\n")
    issues = refused(path)
    assert issues == [Issue(path, 2, 15, ("keys", 0, "key"), "expected a string")]
    assert "1234567890123456789" not in "\n".join(str(issue) for issue in issues)


def test_a_bad_name_is_reported_without_the_name(tmp_path: Path) -> None:
    path = write(tmp_path, f"keys: [{{name: 'b c', key: {KEY}}}]\n")
    assert refused(path) == [Issue(path, 1, 9, ("keys", 0, "name"), "expected a key name of letters, digits, . _ @ -")]


def test_names_used_twice_are_refused_each_once_in_order(tmp_path: Path) -> None:
    entries = ", ".join(f"{{name: {name}, key: {KEY}{i}}}" for i, name in enumerate(["b", "a", "c", "a", "b"]))
    path = write(tmp_path, f"keys: [{entries}]\n")
    assert refused(path) == [Issue(path, None, None, ("keys",), "key names used twice: a, b")]
    assert str(ConfigError(refused(path))) == f"{path}: keys: key names used twice: a, b"


def test_a_name_used_exactly_twice_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, f"keys: [{{name: a, key: {KEY}x}}, {{name: a, key: {KEY}y}}]\n")
    assert [issue.message for issue in refused(path)] == ["key names used twice: a"]


def test_distinct_names_are_all_kept_in_file_order(tmp_path: Path) -> None:
    path = write(tmp_path, f"keys: [{{name: b, key: {KEY}x}}, {{name: a, key: {KEY}y}}]\n")
    assert [key.name for key in load_keys(path)] == ["b", "a"]
