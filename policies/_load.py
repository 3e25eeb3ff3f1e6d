"""Reading a configuration file into a validated, frozen `Config`, or a `ConfigError` listing every problem.

    >>> config = load_config("examples/routing.yaml")         # doctest: +SKIP
    >>> config.policies["auto"].evaluate(answers)             # doctest: +SKIP

Loading is all or nothing: a file with any error yields no `Config`, so a running router that reloads a broken
file keeps the one it has.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from d3backend import Choice, Noul, Question, Score
from policies._answer import ON_ENGINE_ERROR, AnswerTest, compile_answer
from policies._cases import policy_tests
from policies._checker import Checker
from policies._errors import ConfigError, Issue, Path
from policies._expr import compile_condition
from policies._issues import by_line, from_pydantic, kind_of
from policies._lexer import ExpressionError
from policies._params import API_TITLES, param_path, translatable
from policies._policy import Block, OverlapSettings, Policy, Route, Rule, SessionSettings, StateSettings
from policies._schema import (
    ActionSpec,
    ConfigSpec,
    EngineSettings,
    NoulSpec,
    PolicySpec,
    QuestionSpec,
    ScoreSpec,
    ServerSettings,
    UpstreamSettings,
)
from policies._testing import PolicyTest
from policies._yaml import load_yaml

MAX_FILE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Config:
    """A whole, valid configuration. `warnings` lists what is legal but likely a mistake."""

    file: str
    server: ServerSettings
    engine: EngineSettings
    upstreams: Mapping[str, UpstreamSettings]
    policies: Mapping[str, Policy]
    tests: tuple[PolicyTest | AnswerTest, ...]  # the policies' cases, and their answer guards'
    warnings: tuple[Issue, ...]

    @property
    def asks(self) -> bool:
        """Whether any policy asks the engine anything: its rules' questions, or its answer guard's."""
        return any(p.questions or (p.answer is not None and p.answer.questions) for p in self.policies.values())

    @property
    def needs_engine(self) -> bool:
        """Whether the router runs an engine: a policy asks it something, or `engine` names one (applications' own
        questions on /v1/decisions and /v1/systemone need it with no policy asking any). Unnamed, the embedded
        default is started only for policies that ask."""
        engine = self.engine
        named = (engine.embedded, engine.remote, engine.decisions, engine.pool)
        return self.asks or any(kind is not None for kind in named)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate the configuration file at `path`."""
    file = os.fspath(path)
    try:
        with open(file, "rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError([Issue(file, None, None, (), f"cannot read the file: {exc.strerror or exc}")]) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError([Issue(file, None, None, (), f"the file is over {MAX_FILE_BYTES // 2**20} MiB")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([Issue(file, None, None, (), f"the file is not UTF-8 (byte {exc.start})")]) from None
    return parse_config(text, file)


def parse_config(text: str, file: str = "<config>") -> Config:
    """Validate configuration `text`; `file` names it in error messages."""
    try:
        data, marks = load_yaml(text, file)
    except RecursionError:  # YAML nested near libyaml's own limit (1,000 levels) is deeper than Python's stack
        raise ConfigError(
            [Issue(file, None, None, (), "the file nests too deeply to read; a configuration needs a few levels")]
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            [Issue(file, 1, 1, (), f"expected a mapping with `upstreams` and `policies`, found {kind_of(data)}")]
        )
    try:
        spec = ConfigSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(by_line(from_pydantic(exc, marks, file))) from None
    return _Compiler(spec, marks, file).compile()


class _Compiler(Checker):
    """Checks what the schema cannot see (names across sections, conditions, limits) and builds policies."""

    def compile(self) -> Config:
        policies: dict[str, Policy] = {}
        tests: list[PolicyTest | AnswerTest] = []
        for name, policy_spec in self.spec.policies.items():
            path: Path = ("policies", name)
            declared = {qid: self.question(q, (*path, "questions", qid)) for qid, q in policy_spec.questions.items()}
            policy = self.policy(name, policy_spec, declared, path)
            if policy is not None:
                policies[name] = policy
                tests.extend(policy_tests(self, policy, policy_spec, declared, path))
                tests.extend(policy.answer.tests if policy.answer is not None else ())
        for name, spec in self.spec.policies.items():
            if spec.shadow is not None and (spec.shadow == name or spec.shadow not in self.spec.policies):
                others = ", ".join(repr(other) for other in self.spec.policies if other != name) or "none"
                self.issue(("policies", name, "shadow"), f"the shadow must be another policy; expected one of {others}")
        tiers = {upstream.tier for upstream in self.spec.upstreams.values()}
        for name, spec in self.spec.policies.items():
            if spec.session.mode == "escalate" and len(tiers) < 2:
                self.issue(
                    ("policies", name, "session", "mode"),
                    "escalate moves a session to a stronger upstream, but every upstream has the same tier; "
                    "set upstreams.NAME.tier (higher is stronger)",
                    warning=True,
                )
        default = self.spec.server.default_policy
        if default is not None and default not in self.spec.policies:
            known = ", ".join(map(repr, self.spec.policies)) or "none"
            self.issue(("server", "default_policy"), f"unknown policy {default!r}; expected one of {known}")
        self.access()
        self.pool()
        if self.issues:
            raise ConfigError(by_line(self.issues))
        return Config(
            self.file,
            self.spec.server,
            self.spec.engine,
            dict(self.spec.upstreams),
            policies,
            tuple(tests),
            tuple(by_line(self.warnings)),
        )

    def pool(self) -> None:
        """A pool's engines have distinct names, and each but the last leaves the next time to answer within
        server.decision_timeout_s (else failing over could never help)."""
        pool = self.spec.engine.pool
        if pool is None:
            return
        seen: dict[str, int] = {}
        for index, member in enumerate(pool):
            if member.label in seen:
                first = seen[member.label]
                self.issue(("engine", "pool", index), f"two of the pool's engines are called {member.label!r}"
                           f" (engine.pool[{first}] and [{index}]); give each a distinct `name`")  # fmt: skip
            seen.setdefault(member.label, index)
        budget = self.spec.server.decision_timeout_s
        spent = 0.0
        for index, member in enumerate(pool[:-1]):
            spent += member.worst_s
            if spent >= budget:
                self.issue(
                    ("engine", "pool", index, member.kind, "timeout_s"),
                    f"the pool's engines up to {member.label!r} may take {spent:g} s (a remote engine's try and its"
                    f" retry), which uses up server.decision_timeout_s ({budget:g} s): engine.pool[{index + 1}]"
                    " would never answer; lower timeout_s or raise server.decision_timeout_s",
                )
                break

    def access(self) -> None:
        """Keys name known policies and undecided models; what lets a request reach an upstream undecided is warned
        about (issue 25: closed by default)."""
        server = self.spec.server
        auth = server.auth
        if auth is not None:
            seen: set[str] = set()
            for index, key in enumerate(auth.keys):
                if key.name in seen:
                    self.issue(("server", "auth", "keys", index, "name"), f"key name {key.name!r} is used twice")
                seen.add(key.name)
                for name in key.policies or ():
                    if name not in self.spec.policies:
                        known = ", ".join(map(repr, self.spec.policies)) or "none"
                        self.issue(("server", "auth", "keys", index, "policies"),
                                   f"unknown policy {name!r}; expected one of {known}")  # fmt: skip
        if server.undecided_models:
            where = "ignored: server.default_policy decides them" if server.default_policy else "undecided"
            self.issue(("server", "undecided_models"), f"{', '.join(map(repr, server.undecided_models))} reach an "
                       f"upstream without a decision ({where}); no guard sees them", warning=True)  # fmt: skip
        if server.passthrough:
            first = next(iter(self.spec.upstreams), "?")
            self.issue(("server", "passthrough"), f"{', '.join(server.passthrough)} go undecided to the upstream "
                       f"{first!r}, with its key", warning=True)  # fmt: skip

    def policy(self, name: str, spec: PolicySpec, declared: dict[str, Question], path: Path) -> Policy | None:
        rules: list[Rule] = []
        referenced: set[str] = set()
        seen: dict[str, int] = {}
        terminal: str | None = None
        before = len(self.issues)
        for index, rule_spec in enumerate(spec.rules):
            rule_path: Path = (*path, "rules", index)
            if rule_spec.name in seen:
                self.issue(
                    (*rule_path, "name"),
                    f"rule name {rule_spec.name!r} is already used by rules[{seen[rule_spec.name]}]",
                )
            seen[rule_spec.name] = index
            if terminal is not None:
                self.issue(
                    rule_path,
                    f"rule {rule_spec.name!r} is unreachable: rule {terminal!r} before it always ends the walk",
                )
            condition = None
            names: frozenset[str] = frozenset()
            if rule_spec.when is not None:
                try:
                    condition, names = compile_condition(rule_spec.when, declared)
                    referenced |= names
                except ExpressionError as exc:  # the rule by name: a file's rules are many
                    self.issue((*rule_path, "when"), f"rule {rule_spec.name!r}: {exc}")
            action = self.action(rule_spec, rule_path)
            self.params(rule_spec, spec.apis, rule_path)
            if rule_spec.when is None and action is not None and terminal is None:
                terminal = rule_spec.name
            rules.append(Rule(rule_spec.name, rule_spec.when, condition, action, rule_spec.tag, rule_spec.set_, names))
        last = spec.rules[-1]
        if last.when is not None or last.route is None:
            self.issue(
                (*path, "rules", len(spec.rules) - 1),
                f"the last rule ({last.name!r}) must be an unconditional route, the policy's default;"
                " add e.g. `- {name: default, route: <upstream>}`",
            )
        fallback = self.on_engine_error(spec.on_engine_error, spec.rules[-1], spec.apis, (*path, ON_ENGINE_ERROR))
        guard = (
            None if spec.answer is None else compile_answer(spec.answer, self, self.question, (*path, "answer"), name)
        )
        if len(self.issues) > before or fallback is None:
            return None
        unused = tuple(qid for qid in declared if qid not in referenced)
        for qid in unused:
            self.issue(
                (*path, "questions", qid),
                f"question {qid!r} is not used by any rule; it will not be asked",
                warning=True,
            )
        return Policy(
            name,
            spec.description,
            {qid: q for qid, q in declared.items() if qid in referenced},
            tuple(rules),
            fallback,
            StateSettings(spec.state.from_, spec.state.max_chars),
            unused,
            frozenset(spec.apis),
            spec.ask,
            spec.shadow,
            SessionSettings(spec.session.mode, spec.session.ttl_s),
            guard,
            self.overlap(spec, (*path, "overlap")),
        )

    def overlap(self, spec: PolicySpec, path: Path) -> OverlapSettings | None:
        """`overlap:` checked: its route an upstream; `sticky` and `agreeing` read the session, so need one."""
        overlap = spec.overlap
        if overlap is None:
            return None
        if overlap.route is not None and overlap.route not in self.spec.upstreams:
            known = ", ".join(map(repr, self.spec.upstreams))
            self.issue((*path, "route"), f"unknown upstream {overlap.route!r}; expected one of {known}")
        if overlap.when != "always" and spec.session.mode == "off":
            self.issue((*path, "when"), f"`when: {overlap.when}` speculates on the session's route, but the policy's "
                       "session mode is off; use `when: always` or a session mode")  # fmt: skip
        if not spec.questions:
            self.issue(path, "the policy asks the engine nothing, so there is no decision to overlap; remove overlap",
                       warning=True)  # fmt: skip
        return OverlapSettings(overlap.when, overlap.route, overlap.agreed)

    def params(self, spec: ActionSpec, apis: Sequence[str], path: Path) -> None:
        """A parameter that one of the policy's APIs has no equivalent for would be dropped: refuse it here. So is a
        route to an upstream of another API (`upstreams.NAME.api`) that no translation carries one of the policy's
        APIs to, or whose API has no equivalent for a parameter the rule sets (docs/translation.md)."""
        routes = (spec.route,) if isinstance(spec.route, str) else tuple(spec.route or ())
        for upstream in routes:
            settings = self.spec.upstreams.get(upstream)
            target = settings.api if settings is not None else None
            if target is None:
                continue
            stuck = [api for api in apis if not translatable(api, target)]
            if stuck:
                fine = [api for api in apis if api not in stuck]
                self.issue(
                    (*path, "route"),
                    f"upstream {upstream!r} speaks the {API_TITLES[target]} API, and no translation carries the"
                    f" {' or '.join(API_TITLES[a] for a in stuck)} API to it; limit the policy's `apis`"
                    + (f", e.g. `apis: [{', '.join(fine)}]`" if fine else "")
                    + " (docs/translation.md)",
                )
            if any(api != target for api in apis):
                for name in spec.set_:
                    if param_path(target, name) is None:
                        self.issue(
                            (*path, "set", name),
                            f"`set` {name!r} has no equivalent in the {API_TITLES[target]} API that upstream"
                            f" {upstream!r} speaks: a translated request would lose it; remove it or route elsewhere",
                        )
        for name in spec.set_:
            missing = [api for api in apis if param_path(api, name) is None]
            if missing:
                takes = [api for api in apis if api not in missing]
                hint = f"e.g. `apis: [{', '.join(takes)}]`" if takes else "or remove it"
                self.issue(
                    (*path, "set", name),
                    f"`set` {name!r} has no equivalent in the {' or '.join(API_TITLES[a] for a in missing)} API;"
                    f" limit the policy's `apis` to those that take it, {hint}",
                )

    def question(self, spec: QuestionSpec, path: Path) -> Question:
        if isinstance(spec, ScoreSpec) or spec.type == "noul":
            return build_question(spec)
        engine = self.spec.engine
        limit = engine.max_choice_options
        if len(spec.criteria) > limit:
            self.issue(
                (*path, "criteria"),
                f"this choice has {len(spec.criteria)} options; the engine takes at most {limit}"
                " (engine.max_choice_options: 255 for d3 models, 26 for generative ones)",
            )
            return build_question(spec)
        for index, member in enumerate(engine.pool or ()):  # every engine of a pool may be the one asked
            own = member.max_choice_options
            if own is not None and len(spec.criteria) > own:
                self.issue(
                    (*path, "criteria"),
                    f"this choice has {len(spec.criteria)} options; the pool's engine {member.label!r} takes at most"
                    f" {own} (engine.pool[{index}].max_choice_options)",
                )
                break
        return build_question(spec)

    def action(self, spec: ActionSpec, path: Path) -> Route | Block | None:
        if spec.block is not None:
            return Block(spec.block.status, spec.block.message, spec.block.as_answer)
        if spec.route is None:
            return None
        upstreams = (spec.route,) if isinstance(spec.route, str) else tuple(spec.route)
        for name in upstreams:
            if name not in self.spec.upstreams:
                known = ", ".join(map(repr, self.spec.upstreams))
                self.issue((*path, "route"), f"unknown upstream {name!r}; expected one of {known} (see `upstreams`)")
        return Route(upstreams)

    def on_engine_error(
        self, spec: ActionSpec | None, default: ActionSpec, apis: Sequence[str], path: Path
    ) -> Rule | None:
        if spec is None:  # fail open: the policy's default route (its names are checked there)
            if default.route is None:
                return None  # the missing default is reported already
            upstreams = (default.route,) if isinstance(default.route, str) else tuple(default.route)
            return Rule(ON_ENGINE_ERROR, None, None, Route(upstreams), {}, {})
        action = self.action(spec, path)
        self.params(spec, apis, path)
        if action is None:
            self.issue(path, "`on_engine_error` must `route` or `block`")
            return None
        return Rule(ON_ENGINE_ERROR, None, None, action, spec.tag, spec.set_)


def build_question(spec: QuestionSpec) -> Question:
    """The engine's question a validated question spec describes (a policy's, or one the router is asked on
    `/v1/systemone`); limits that depend on the engine are the caller's to check."""
    if isinstance(spec, ScoreSpec):
        return Score(spec.instructions, tuple(spec.criteria))
    if isinstance(spec, NoulSpec):
        criteria = spec.criteria
        return Noul(spec.instructions, criteria.true if criteria else None, criteria.false if criteria else None)
    return Choice(spec.instructions, dict(spec.criteria))
