"""Sessions (issue 12): the turns of one conversation keep the route their first routed turn chose.

    sessions = Sessions(store, config.server.sessions, salt, metrics)
    turn = sessions.turn(api, scope["headers"], body, config, caller=caller.id)  # per request; nothing read yet
    d3 = await service.decide(policy, body, after=turn.route)    # guards first; then the session's route
    await turn.remember(response_body)                           # Responses: the answer's id joins the session

A request's session key is, the first found: the `x-session-id` header (`server.sessions.session_id_header`), the
header `server.sessions.header`, a coding agent's own conversation id (`server.sessions.agent_ids`: Claude Code's
`x-claude-code-session-id`, Codex's `session-id` / `thread-id`), the body's `user`, `safety_identifier` or
`prompt_cache_key` (chat, responses), `metadata.user_id` (messages; with `agent_ids`, the `session_id` inside
Claude Code's), a Responses `previous_response_id` (the session of the response it continues, known from the answers
this router relayed, streamed ones from their `response.created` event) or `conversation`, and, with no id at all,
the conversation's opening (its system prompt and first user turn, with a hash of the client's credential, so that
two users' identical openings are two sessions).

Agents open conversations inside their session (issue 26.4): Claude Code's sub-agent (the `Agent` tool) sends the
parent's session id with an opening of its own, and a compacted history opens anew under the same id. A session
named by the client (a header) or by an agent's id is therefore kept per opening: the session's record holds its
route and a hash of the opening that started it; a conversation with another opening starts on the session's route
(sticky, not decided anew) and keeps any route of its own (an escalation) under its own key, so that it never
overwrites the route of the conversation that opened the session.
Every key is scoped by the caller (issue 25.3: the client key's name, or a hash of the credential the request
carries): two callers sending the same id, or continuing the same response id, never share a session; a response
or conversation relayed to one caller is refused to every other (router/_sessions/owners.py). Keys are hashed
(BLAKE2, salted) before they are stored or logged; the store holds upstream names only.

The session never replaces a guard: the policy decides every turn in full, and only a route is then replaced by the
session's (a block stands). The body's fields are read without asking which API sent them (style 14).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from policies import Config, Route, ServerSettings, SessionServerSettings, SessionSettings
from router._apis.chat import Api
from router._apis.content import Content
from router._apis.state import Turn
from router._decision.record import D3Decision
from router._errors import BadRequest
from router._observe.metrics import Counts, Metrics
from router._sessions.owners import Owners, answer_id, conversation_of
from router._sessions.store import Store

logger = logging.getLogger(__name__)

SESSION_HEADER = b"x-session-id"
BODY_IDS = ("user", "safety_identifier", "prompt_cache_key")
# Coding agents' own conversation ids (issue 26.4): Claude Code, then Codex (older releases spell it with `_`).
AGENT_HEADERS = (b"x-claude-code-session-id", b"session-id", b"session_id", b"thread-id")
# Sources naming a session that a new opening continues (a sub-agent, a compaction) rather than starts anew.
NAMED = frozenset({"header", "agent", "previous_response_id", "conversation"})
OUTCOMES = ("new", "sticky", "escalated", "off")


class Sessions:
    """Finds sessions and keeps their routes in a `Store`; one per app."""

    def __init__(self, store: Store, settings: SessionServerSettings, salt: bytes, metrics: Metrics) -> None:
        self.store = store
        self.settings = settings
        self.salt = salt  # also the salt of anonymous callers' ids (router/_faces/auth.py)
        self._salt = hashlib.blake2b(salt, digest_size=32).digest()  # any length in, BLAKE2's key size out
        self.relays = False  # the proxy: it calls upstreams with its own key (an unknown conversation is refused)
        self.counts: Counts[tuple[str, str]] = metrics.counter(
            "d3router_sessions",
            "Routed turns by policy and session outcome: new, sticky, escalated (to a stronger upstream) or off.",
            ("policy", "outcome"),
        )

    @property
    def owners(self) -> Owners:
        """Whose each relayed response and conversation is (in the store of the moment: a test may swap it)."""
        return Owners(self.store, self.hash)

    def hash(self, kind: str, value: str | bytes, caller: str = "") -> str:
        """The stored and logged form of a session id of `caller`: salted BLAKE2, 32 hex characters."""
        data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
        scope = caller.encode("utf-8", "surrogatepass")
        prefix = b"%s\0%d:%s" % (kind.encode(), len(scope), scope)  # length-prefixed: no caller id can pose as another
        return hashlib.blake2b(prefix + data, key=self._salt, digest_size=16).hexdigest()

    def turn(self, api: Api, headers: Iterable[tuple[bytes, bytes]], body: Mapping[str, Any], config: Config, *,
             caller: str, dry: bool = False) -> SessionTurn:  # fmt: skip
        """The session part of one request of `caller` (its id: issue 25.3); `dry` (explain) stores nothing."""
        turn = SessionTurn(self, api, dict(headers), body, config, caller)
        turn.dry = dry
        return turn


class SessionTurn:
    """One request's session: found lazily (only a routed turn of a policy with sessions reads the store)."""

    def __init__(self, sessions: Sessions, api: Api, headers: Mapping[bytes, bytes], body: Mapping[str, Any],
                 config: Config, caller: str) -> None:  # fmt: skip
        self.sessions = sessions
        self.caller = caller
        self.api = api
        self.headers = headers
        self.body = body
        self.config = config
        self.key: str | None = None  # hashed, once found
        self.source: str | None = None
        self.opening: str | None = None  # hashed: which conversation of a named session this is
        self.ttl_s = 0.0
        self.dry = False  # explain: say what would happen, store nothing
        self._turns: list[Turn] | None = None
        self._stored: tuple[str, tuple[str, ...] | None, str] | Literal[False] | None = False  # not read yet

    @property
    def wants_answer(self) -> bool:
        """Whether the answer's id is worth remembering: any Responses turn (whose it is, and its session)."""
        return self.api.chains_answers and not self.dry

    # --- finding the session -----------------------------------------------------------------------------------
    async def find(self) -> str | None:
        """The hashed session key, or None when the request carries nothing to find one by."""
        sessions, settings, caller = self.sessions, self.sessions.settings, self.caller
        names = ([SESSION_HEADER] if settings.session_id_header else []) + (
            [settings.header.encode("latin-1")] if settings.header else []
        )
        for name in names:
            value = self.headers.get(name)
            if value:
                return self._found("header", sessions.hash("id", value, caller))
        if settings.agent_ids:
            for name in AGENT_HEADERS:
                value = self.headers.get(name)
                if value:
                    return self._found("agent", sessions.hash("agent", value, caller))
        if settings.body_ids:
            for field in BODY_IDS:
                value = self.body.get(field)
                if isinstance(value, str) and value:
                    agent = field == "prompt_cache_key" and settings.agent_ids  # Codex's conversation id
                    return self._found("agent" if agent else field, sessions.hash("id", value, caller))
            metadata = self.body.get("metadata")
            user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
            if isinstance(user_id, str) and user_id:
                agent_id = _claude_session(user_id) if settings.agent_ids else None
                if agent_id is not None:
                    return self._found("agent", sessions.hash("agent", agent_id, caller))
                return self._found("metadata.user_id", sessions.hash("id", user_id, caller))
            previous = self.body.get("previous_response_id")
            if isinstance(previous, str) and previous:
                known = await self._continued(previous)
                chain = known or sessions.hash("response-chain", previous, caller)
                return self._found("previous_response_id", chain)
            conversation = conversation_of(self.body)  # whose it is: checked in `route`, whatever the session mode
            if conversation is not None:
                return self._found("conversation", sessions.hash("conversation", conversation, caller))
        if settings.fingerprint:
            opening = self._opening()
            if opening is not None:
                return self._found("fingerprint", sessions.hash("opening", opening, caller))
        return None

    async def _continued(self, response_id: str) -> str | None:
        """The session of the response `response_id` continues, if this router relayed it to this caller; a
        response it relayed to another caller is `BadRequest` (400 previous_response_not_found, as OpenAI answers
        an id it does not know): the upstream, called with the router's own key, would continue that caller's
        conversation for this one (issue 25.3)."""
        record = await self.sessions.owners.record("response", response_id)
        if record is None:
            return None
        if record.caller != self.sessions.hash("caller", self.caller):
            raise BadRequest("the previous response was not found (previous_response_id names a response of "
                             "another caller)", "previous_response_id", code="previous_response_not_found")  # fmt: skip
        return record.session or None

    def _found(self, source: str, key: str) -> str:
        self.source, self.key = source, key
        if source in ("header", "agent"):
            opening = self._opening()
            self.opening = None if opening is None else self.sessions.hash("opening", opening, self.caller)
        return key

    def turns(self) -> list[Turn]:
        """The request's turns, read once (the opening, the opening-turn and the tool-result checks share them)."""
        if self._turns is None:
            try:
                self._turns = self.api.turns(self.body, Content(lenient=True))
            except BadRequest:  # decided already; a body the adapter cannot read has no turns to go by
                self._turns = []
        return self._turns

    def _opening(self) -> bytes | None:
        """The system turns and the first user turn, with the client's credential: what every later turn of the
        conversation repeats."""
        turns = self.turns()
        first = next((index for index, turn in enumerate(turns) if turn.role == "user"), None)
        if first is None:
            return None
        # Each part length-prefixed, so that no text can make two openings look alike (and cheaper than JSON).
        parts = []
        for turn in turns[: first + 1]:
            if turn.role != "assistant":
                role, text = turn.role.encode(), turn.text.encode("utf-8", "surrogatepass")
                parts.append(b"%d:%s%d:%s" % (len(role), role, len(text), text))
        credential = self.headers.get(self.api.key_header, b"")
        parts.append(b"k%d:%s" % (len(credential), credential))
        return b"".join(parts)

    # --- routing -------------------------------------------------------------------------------------------------
    async def route(self, d3: D3Decision) -> D3Decision:
        """After the policy decided (guards included): a route becomes the session's, a block stands."""
        policy = self.config.policies.get(d3.policy)
        action = d3.decision.action
        if policy is None or not isinstance(action, Route):
            return d3
        if self._turns is None and d3.state.turns:
            self._turns = list(d3.state.turns)  # the decision read them already
        settings = policy.session
        self.ttl_s = settings.ttl_s  # how long the answer's record is kept (`remember`), whatever the mode
        stored = await self.stored(d3.policy, settings)
        if stored is None:
            await self._check_owned(action.upstreams)
            return self._outcome(d3, "off", action.upstreams)
        key, previous, mark = stored
        if previous is None:
            outcome, upstreams = "new", action.upstreams
        elif (settings.mode == "escalate" and not self._tool_turn() and not self._holds_reasoning()
              and self._tier(action) > self._tier(previous)):  # fmt: skip
            outcome, upstreams = "escalated", action.upstreams
        else:
            outcome, upstreams = "sticky", previous
        await self._check_owned(upstreams)
        if outcome != "sticky" and not self.dry:
            await self.sessions.store.set(key, ",".join(upstreams) + mark, settings.ttl_s)
        return self._outcome(d3, outcome, upstreams)

    async def _check_owned(self, upstreams: tuple[str, ...]) -> None:
        """What the request continues is this caller's, whatever found its session (or none): a `previous_response_id`
        (`_continued`, unless the session was found by it), and a Responses `conversation` (router/_sessions/owners.py):
        404 if another's, or, in the proxy, one it never relayed, unless every upstream of the route is sent the
        caller's own credential."""
        previous = self.body.get("previous_response_id")
        if isinstance(previous, str) and previous and self.source != "previous_response_id":
            await self._continued(previous)
        conversation = conversation_of(self.body)
        if conversation is not None:
            own = all(self.config.upstreams[name].forward_client_key for name in upstreams if name in
                      self.config.upstreams)  # fmt: skip
            await self.sessions.owners.check("conversation", conversation, self.caller, param="conversation",
                                             unknown_ok=own or not self.sessions.relays)  # fmt: skip

    async def stored(self, policy: str, settings: SessionSettings) -> tuple[str, tuple[str, ...] | None, str] | None:
        """The session's record for this turn, read once (an overlap reads it before the decision, `route` after):
        its store key, its route (None on an opening turn or a new session) and the opening mark to store; None
        when the policy keeps no session or the request names none."""
        if self._stored is not False:
            return self._stored
        self._stored = None
        if settings.mode == "off" or await self.find() is None or self.key is None:
            return None
        self.ttl_s = settings.ttl_s
        store, ttl = self.sessions.store, None if self.dry else settings.ttl_s
        key = _session_key(policy, self.key)
        previous, root, mark = None, self.opening or "", f"#{self.opening}" if self.opening else ""
        if not self._opening_turn():  # an opening decides anew: nothing to read
            previous, root = self._record(await store.get(key, ttl))
            if root and self.opening and root != self.opening:  # another conversation inside the session
                key, mark = f"{key}:{self.opening}", ""
                own = self._record(await store.get(key, ttl))[0]
                previous = own or previous  # its own route once it has one, else the session's
            elif root:
                mark = f"#{root}"
        self._stored = (key, previous, mark)
        return self._stored

    def _record(self, stored: str | None) -> tuple[tuple[str, ...] | None, str]:
        """A stored session: its route (if every upstream in it is still configured) and the hash of the opening
        that started it (empty when none was kept)."""
        route, _, root = (stored or "").partition("#")
        return self._upstreams(route), root

    def _outcome(self, d3: D3Decision, outcome: str, upstreams: tuple[str, ...]) -> D3Decision:
        if not self.dry:
            self.sessions.counts[(d3.policy, outcome)] += 1
        decision = d3.decision
        if isinstance(decision.action, Route) and upstreams != decision.action.upstreams:
            policy = self.config.policies.get(d3.policy)  # the tags and `set` of the route taken (issue 26.5)
            decision = policy.sent_on(decision, upstreams) if policy else decision._replace(action=Route(upstreams))
        return dataclasses.replace(d3, decision=decision, session=outcome, session_key=self.key)

    def _upstreams(self, stored: str | None) -> tuple[str, ...] | None:
        """The stored route, if every upstream in it is still configured (a reload may have removed one)."""
        if not stored:
            return None
        names = tuple(stored.split(","))
        return names if all(name in self.config.upstreams for name in names) else None

    def _tier(self, route: Route | tuple[str, ...]) -> int:
        """The strength of a route: its first upstream's tier (the others are its fallbacks)."""
        upstreams = route.upstreams if isinstance(route, Route) else route
        return self.config.upstreams[upstreams[0]].tier

    def _opening_turn(self) -> bool:
        """A conversation's first turn (no assistant turn yet) starts the session anew, unless the client named the
        session itself (a header) or continues a stored response: identical first questions of strangers, or a
        user's next conversation, are decided on their own."""
        if self.source in NAMED:
            return False
        return not any(turn.role in ("assistant", "tool") for turn in self.turns())

    def _holds_reasoning(self) -> bool:
        """The conversation carries the model's own signed reasoning (Anthropic `thinking` / `redacted_thinking`
        blocks, Responses `reasoning` items): only the upstream that made it can read it back, so the session is
        never moved off it, escalation included (issue 26.1)."""
        items = self.body.get("messages") if "messages" in self.body else self.body.get("input")
        for item in items if isinstance(items, list) else ():
            if not isinstance(item, dict):
                continue
            if item.get("type") == "reasoning":
                return True
            content = item.get("content")
            if (
                item.get("role") == "assistant"
                and isinstance(content, list)
                and any(
                    isinstance(part, dict) and part.get("type") in ("thinking", "redacted_thinking") for part in content
                )
            ):
                return True
        return False

    def _tool_turn(self) -> bool:
        """The last message is a tool result: the agent's step goes on where it started."""
        turns = self.turns()
        return bool(turns) and turns[-1].role == "tool"

    async def remember(self, answer: bytes, upstream: str = "") -> None:
        """A Responses answer's `id` joins this session, so that a request continuing it (`previous_response_id`)
        finds the session: a whole JSON answer, or a stream's event carrying the response (`response.created`,
        read before the stream ends); decoded already (`relay`). An unreadable one is left alone."""
        if self.dry:
            return
        response_id = answer_id(answer)
        if response_id is not None:
            # One record per response, whoever sent it: its caller (hashed), its session and the upstream that keeps
            # it, so that another caller continuing or reading it is refused, not only kept out of the session.
            await self.sessions.owners.note("response", response_id, self.caller, upstream=upstream,
                                            ttl_s=self.ttl_s, session=self.key or "")  # fmt: skip


def session_salt(server: ServerSettings, environ: Mapping[str, str]) -> bytes:
    """The salt of hashed keys: `server.sessions.salt_env`'s value; unset, a random one per process. With
    `server.redis` it must be set and not empty (replicas must agree, and no one reading Redis may test a guessed
    prompt against a salt in the source): `SaltMissing` otherwise, with the fix in its message."""
    name = server.sessions.salt_env
    value = environ.get(name) if name is not None else None
    if value:
        return value.encode("utf-8")
    if server.redis is not None:
        raise SaltMissing(
            f"server.redis shares hashed session and cache keys, but {name or 'server.sessions.salt_env'!s} "
            "is unset or empty; set server.sessions.salt_env to a variable holding a secret salt on every replica "
            "(e.g. `openssl rand -hex 32`)"
        )
    if name is not None:
        logger.warning("server.sessions.salt_env names %r, which is unset or empty; session keys use a random salt "
                       "of this process", name)  # fmt: skip
    return os.urandom(32)


class SaltMissing(RuntimeError):
    """With `server.redis`, the salt's variable is unset: the router refuses to start."""


def _claude_session(user_id: str) -> str | None:
    """The `session_id` inside Claude Code's `metadata.user_id`: a JSON object in current releases, else the
    `..._session_<uuid>` form of older ones; None for any other user id."""
    if user_id.startswith("{"):
        try:
            data = json.loads(user_id)
        except ValueError:
            return None
        value = data.get("session_id") if isinstance(data, dict) else None
        return value if isinstance(value, str) and value else None
    _, found, value = user_id.rpartition("_session_")
    return value if found and value else None


def _session_key(policy: str, key: str) -> str:
    return f"d3:session:{policy}:{key}"
