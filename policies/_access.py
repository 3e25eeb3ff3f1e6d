"""Who may call (issue 25): the `server.auth` section, its client keys, their groups and rate limits.

    server:
      auth:
        keys:
          - {name: ci, key_env: D3_KEY_CI, group: bots, policies: [auto], rate: {requests: 60, window_s: 60}}
        keys_file: keys.yaml        # a mounted secret: `keys: [...]` of the same entries, reread on reload
        groups: {bots: {rate: {requests: 600, window_s: 60}}}

A key is kept only as its SHA-256 digest; in the configuration file it is named by an environment variable
(`key_env`) or given as that digest (`sha256`); a keys file may also hold the key itself (`key`).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from policies._strict import Strict, check_env

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_KEY_CHARS = 512  # longer credentials are refused before they are hashed


class RateSpec(Strict):
    """Requests per window with a burst (GCRA: one request every window_s/requests, up to `burst` at once)."""

    requests: int = Field(gt=0, description="Requests allowed per window.")
    window_s: float = Field(60.0, gt=0, description="The window, in seconds.")
    burst: int | None = Field(
        None, gt=0, description="Requests allowed at once after a quiet spell; unset: `requests` (a whole window)."
    )

    @property
    def interval_s(self) -> float:
        return self.window_s / self.requests

    @property
    def most(self) -> int:
        return self.requests if self.burst is None else self.burst


class BudgetSpec(Strict):
    """Tokens (and/or cost) allowed over a calendar period, shared by the replicas through server.redis (issue 29.4):
    a request while it is used up is answered 429, naming the budget and when it resets (Retry-After); rules read
    the share used as `budget.used`."""

    tokens: int | None = Field(None, gt=0, description="Tokens (input and output, as the upstreams report them).")
    cost: float | None = Field(None, gt=0, description="Cost, in the upstreams' price currency (upstreams.NAME.price).")
    period: Literal["day", "month"] = Field("day", description="Resets at each UTC midnight, or each month's first.")

    @model_validator(mode="after")
    def _some(self) -> BudgetSpec:
        if self.tokens is None and self.cost is None:
            raise PydanticCustomError("budget", "a budget needs `tokens` or `cost` (or both)")
        return self


class TokenRateSpec(Strict):
    """Tokens per window (a fixed window: the tokens of the answers counted in it), beside the request `rate`."""

    tokens: int = Field(gt=0, description="Tokens allowed per window (input and output, as reported).")
    window_s: float = Field(60.0, gt=0, description="The window, in seconds (60: tokens per minute).")


class ClientKeySpec(Strict):
    """One client key: its name is the caller (sessions, logs, limits are kept per name)."""

    name: str = Field(description="The caller: letters, digits, `.`, `_`, `@`, `-`; unique.")
    key_env: str | None = Field(None, description="Environment variable holding the key.")
    sha256: str | None = Field(None, description="The key's SHA-256, in hex (the file then holds no key).")
    key: str | None = Field(None, description="The key itself: only in `keys_file` (a mounted secret).")
    group: str | None = Field(None, description="A group of keys sharing `groups.NAME.rate`.")
    policies: list[str] | None = Field(
        None, description="Policies (model names) this key may use; unset: every policy. /v1/models lists only these."
    )
    models: list[str] | None = Field(
        None, description="Of server.undecided_models, those this key may send undecided; unset: all of them."
    )
    debug: bool = Field(
        False,
        description="Sees every x-d3-* header (answers, rule, cache, upstream, tags) and may call /v1/d3/explain.",
    )
    rate: RateSpec | None = Field(None, description="This key's own request rate limit.")
    token_rate: TokenRateSpec | None = Field(None, description="This key's own token rate limit.")
    budget: BudgetSpec | None = Field(None, description="This key's own token or cost budget.")

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _NAME.match(name):
            raise PydanticCustomError("name", "expected a key name of letters, digits, . _ @ -, found {n}",
                                      {"n": repr(name)})  # fmt: skip
        return name

    @field_validator("key_env")
    @classmethod
    def _env(cls, name: str | None) -> str | None:
        return check_env(name)

    @field_validator("sha256")
    @classmethod
    def _digest(cls, digest: str | None) -> str | None:
        if digest is not None and not _SHA256.match(digest.lower()):
            raise PydanticCustomError("sha256", "expected 64 hex digits (sha256sum of the key)")
        return None if digest is None else digest.lower()

    @model_validator(mode="after")
    def _one_source(self) -> ClientKeySpec:
        given = [name for name in ("key_env", "sha256", "key") if getattr(self, name) is not None]
        if len(given) != 1:
            raise PydanticCustomError(
                "key", "key {n} needs exactly one of key_env, sha256 or key (in a keys file)", {"n": repr(self.name)}
            )
        if self.key is not None and not 16 <= len(self.key) <= MAX_KEY_CHARS:
            raise PydanticCustomError("key", "key {n} must be 16 to 512 characters", {"n": repr(self.name)})
        return self


class GroupSpec(Strict):
    """What the keys of one group share."""

    rate: RateSpec | None = Field(None, description="The group's request rate limit, shared by its keys.")
    token_rate: TokenRateSpec | None = Field(None, description="The group's token rate limit, shared by its keys.")
    budget: BudgetSpec | None = Field(None, description="The group's token or cost budget, shared by its keys.")


class KeysFileSpec(Strict):
    """A keys file (`server.auth.keys_file`)."""

    keys: list[ClientKeySpec] = Field(default_factory=list)


class AuthSettings(Strict):
    """Client keys: with this section, every path but /healthz and /readyz needs a key (/metrics its token if set,
    /admin/reload the admin token); a missing or wrong key is a 401 in the API's own shape."""

    keys: list[ClientKeySpec] = Field(default_factory=list, description="Keys by name; see ClientKeySpec.")
    keys_file: str | None = Field(
        None,
        description="A YAML file `keys: [...]` (a mounted secret; relative to this file's folder), reread with the "
        "configuration (on change, SIGHUP, POST /admin/reload); requests in flight keep the keys they came with.",
    )
    groups: dict[str, GroupSpec] = Field(default_factory=dict, description="Groups by name: their shared limits.")

    @model_validator(mode="after")
    def _keys(self) -> AuthSettings:
        if not self.keys and self.keys_file is None:
            raise PydanticCustomError("auth", "server.auth needs `keys` or `keys_file`")
        for spec in self.keys:
            if spec.key is not None:
                raise PydanticCustomError(
                    "key", "key {n} is written in the configuration; use key_env or sha256 (or keys_file)",
                    {"n": repr(spec.name)},
                )  # fmt: skip
        return self
