"""The base of every configuration section, and the checks several sections share (URLs, environment variable
names, header names)."""

from __future__ import annotations

import difflib
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Strict(BaseModel):
    """Base of every section: frozen, unknown keys refused with the closest known key suggested."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = [field.alias or name for name, field in cls.model_fields.items()]
            for key in data:
                if key not in known:
                    close = difflib.get_close_matches(str(key), known, n=1)
                    hint = f"did you mean {close[0]!r}? " if close else ""
                    raise PydanticCustomError(
                        "unknown_key",
                        "unknown key {key}; {hint}expected one of {known}",
                        {"key": repr(key), "hint": hint, "known": ", ".join(known), "offending": str(key)},
                    )
        return data


def check_url(url: str) -> str:
    if not re.match(r"^https?://[^/\s]+", url):
        raise PydanticCustomError("url", "expected an http(s) URL, found {u}", {"u": repr(url)})
    return url


def check_env(name: str | None) -> str | None:
    if name is not None and not _ENV_NAME.match(name):
        raise PydanticCustomError(
            "env",
            "expected the name of an environment variable (not the key itself), found {n}",
            {"n": "a value that is not a name"},
        )
    return name
