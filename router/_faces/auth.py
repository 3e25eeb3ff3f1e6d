"""Who is calling (issue 25): client keys, kept as SHA-256 digests, and the caller each request is served as.

    access = Access(config, environ, salt)             # built once; `reload(config)` swaps the keys whole
    caller = access.caller(scope["headers"])           # a `Caller`, or `Unauthorized` (401) with keys on

With `server.auth`, a request carries its key as `Authorization: Bearer KEY` or `x-api-key: KEY` (both only if they
agree); anything else (none, two, a wrong scheme, a control character, over 512 characters, a key not known) is
refused before the body is read. The key is hashed and looked up by its digest, then compared with
`hmac.compare_digest`, so the time taken tells nothing of the keys (vLLM's AuthenticationMiddleware does the same).
Without it, every request is an anonymous caller identified by a salted hash of the credential it carries (none is
one caller too): sessions and explain are still kept apart per credential.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from policies import BudgetSpec, ClientKeySpec, Config, Facts, RateSpec, TokenRateSpec, load_keys
from policies._access import MAX_KEY_CHARS
from router._apis.facts import caller_facts
from router._errors import Unauthorized

logger = logging.getLogger(__name__)

_TOKEN = re.compile(rb"^[\x21-\x7e]+$")  # visible ASCII: no space, no control character, nothing a parser reads twice
_HOW = "send a key of server.auth as `Authorization: Bearer KEY` or `x-api-key: KEY`"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request comes from: `id` scopes its sessions, its explain and its log line; the rest is what it may do.
    `policies` and `models` None: no limit."""

    id: str
    name: str | None = None  # the key's name with keys on
    group: str | None = None
    policies: frozenset[str] | None = None
    models: frozenset[str] | None = None
    debug: bool = False
    rate: RateSpec | None = None
    group_rate: RateSpec | None = None
    # Token rates and budgets (issue 29.4; router/_faces/budgets.py): the key's own and its group's.
    token_rate: TokenRateSpec | None = None
    group_token_rate: TokenRateSpec | None = None
    budget: BudgetSpec | None = None
    group_budget: BudgetSpec | None = None

    @property
    def facts(self) -> Facts:
        """The `caller.*` facts rules read (issue 29): the key's name and group, empty for an anonymous caller."""
        return caller_facts(self.name, self.group)

    def may_use(self, policy: str) -> bool:
        return self.policies is None or policy in self.policies

    def may_send_undecided(self, model: str) -> bool:
        return self.models is None or model in self.models


@dataclass(frozen=True, slots=True)
class _Key:
    digest: bytes
    caller: Caller


class Access:
    """The keys in force (swapped whole on reload: a request keeps the caller it was authenticated as) and the salt
    that turns an anonymous credential into a caller id."""

    def __init__(self, config: Config, environ: Mapping[str, str], salt: bytes) -> None:
        self.environ = environ
        self._salt = hashlib.blake2b(b"caller\0" + salt, digest_size=32).digest()
        self.on = config.server.auth is not None
        self._keys: dict[bytes, _Key] = self._load(config)

    def reload(self, config: Config) -> None:
        """Read the keys again (the configuration and its keys file); `ConfigError` keeps the running ones."""
        self.use(config, self.build(config))

    def build(self, config: Config) -> dict[bytes, _Key]:
        """The key table `config` names (its keys file read now), for `use`: a reload builds everything first."""
        return self._load(config)

    def use(self, config: Config, keys: dict[bytes, _Key]) -> None:
        """Swap in a table `build` made: one assignment each, nothing that can fail."""
        self.on, self._keys = config.server.auth is not None, keys

    def _load(self, config: Config) -> dict[bytes, _Key]:
        auth = config.server.auth
        if auth is None:
            return {}
        specs: list[ClientKeySpec] = list(auth.keys)
        if auth.keys_file is not None:
            specs += load_keys(Path(config.file).parent / auth.keys_file)
        table: dict[bytes, _Key] = {}
        for spec in specs:
            digest = self._digest(spec)
            if digest is None:
                continue
            group = auth.groups.get(spec.group) if spec.group is not None else None
            caller = Caller(
                f"key:{spec.name}", spec.name, spec.group,
                None if spec.policies is None else frozenset(spec.policies),
                None if spec.models is None else frozenset(spec.models),
                spec.debug, spec.rate, group.rate if group is not None else None,
                spec.token_rate, group.token_rate if group is not None else None,
                spec.budget, group.budget if group is not None else None,
            )  # fmt: skip
            table[digest] = _Key(digest, caller)
        if not table:
            logger.warning("server.auth has no usable key: every request is refused with 401")
        return table

    def _digest(self, spec: ClientKeySpec) -> bytes | None:
        if spec.sha256 is not None:
            return bytes.fromhex(spec.sha256)
        key = spec.key if spec.key is not None else self.environ.get(spec.key_env or "", "")
        if not key:
            logger.warning("key %r: %s is unset or empty; the key is not usable", spec.name, spec.key_env)
            return None
        return hashlib.sha256(key.encode("utf-8")).digest()

    def caller(self, headers: Iterable[tuple[bytes, bytes]]) -> Caller:
        """The request's caller; with keys on, `Unauthorized` unless it carries one known key."""
        bearer: list[bytes] = []
        api_keys: list[bytes] = []
        for name, value in headers:
            if name == b"authorization":
                bearer.append(value)
            elif name == b"x-api-key":
                api_keys.append(value)
        if not self.on:
            joined = b"\0".join([*bearer, b"", *api_keys])
            return Caller("anon:" + hashlib.blake2b(joined, key=self._salt, digest_size=12).hexdigest())
        token = _credential(bearer, api_keys)
        digest = hashlib.sha256(token).digest()
        found = self._keys.get(digest)
        if found is None or not hmac.compare_digest(found.digest, digest):
            raise Unauthorized(f"the key is not known; {_HOW}")
        return found.caller


def _credential(bearer: list[bytes], api_keys: list[bytes]) -> bytes:
    """The one key the headers carry, or `Unauthorized` saying what is wrong with them (never echoing them)."""
    if len(bearer) > 1 or len(api_keys) > 1:
        raise Unauthorized(f"the request carries more than one key header; {_HOW}")
    tokens = []
    if bearer:
        scheme, _, rest = bearer[0].strip(b" \t").partition(b" ")
        if scheme.lower() != b"bearer":
            raise Unauthorized(f"the Authorization header is not a Bearer key; {_HOW}")
        tokens.append(rest.strip(b" \t"))
    if api_keys:
        tokens.append(api_keys[0].strip(b" \t"))
    if not tokens:
        raise Unauthorized(f"the request carries no key; {_HOW}")
    for token in tokens:
        if not token or len(token) > MAX_KEY_CHARS or not _TOKEN.match(token):
            raise Unauthorized(f"the key is malformed (1 to {MAX_KEY_CHARS} visible ASCII characters); {_HOW}")
    if len(tokens) == 2 and not hmac.compare_digest(tokens[0], tokens[1]):
        raise Unauthorized(f"Authorization and x-api-key carry different keys; {_HOW}")
    return tokens[0]


def key_digest(key: str) -> str:
    """The `sha256` a configuration may hold instead of the key: `d3router` users get it from `sha256sum` too."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()
