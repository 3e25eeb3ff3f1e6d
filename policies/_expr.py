"""`when` conditions: a small expression language over the engine's answers, compiled once, never `eval`'d.

    jailbreak > 0.9                         a noul is P(yes)
    kind == "code" and difficulty >= 1.5    a choice is its pick; a score its expected level (0-based)
    kind.code > 0.6 or kind["math"] > 0.6   an option's probability (the bracket form takes any option name)
    difficulty.hard >= 0.5                  a score level's probability
    kind.confidence < 0.5                   the pick's confidence (also for nouls and scores)
    kind in ["code", "math"]                membership; also `not in`
    0.2 < jailbreak <= 0.9                  chained comparisons
    not (pii > 0.5)                         `and`, `or`, `not`, parentheses; `true`, `false`
    request.tokens > 100000                 a fact (policies/_facts.py): the router knows it, the engine is not asked

Every name and option is checked against the declared questions and the facts, and every operand's type against its
operator, when the policy loads. `compile_condition` returns a plain closure over the answers mapping.
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from d3backend import Choice, Noul, Question, Score
from policies._facts import FACTS, SCOPES
from policies._lexer import ExpressionError, Token, tokenize, unquote

# Over what is known by name: the engine's answers by question id, the facts by their dotted names.
Condition = Callable[[Mapping[str, Any]], bool]
_Fn = Callable[[Any], Any]  # over that mapping; each closure knows its value's type

MAX_EXPRESSION_DEPTH = 64  # nesting of parentheses, `not` and lists; issue 19.7
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


@dataclass(frozen=True, slots=True)
class _Typed:
    """A compiled operand: its type, its closure, and what it reads (for messages and option checks)."""

    type: str  # "number", "string", "bool", "list"
    fn: _Fn
    pos: int
    const: Any = None
    is_const: bool = False
    choice: str | None = None  # set when this is a choice's pick, to check compared options
    options: tuple[str, ...] | None = None  # the values a string fact takes, to check compared ones
    owner: str = ""  # whose options they are, for messages
    what: str = ""  # what the value is, for messages
    text: str = ""  # the operand as written, for hints


def _constant(kind: str, value: Any, pos: int) -> _Typed:
    def fn(answers: Any) -> Any:
        return value

    return _Typed(kind, fn, pos, value, True)


def _any(checks: list[_Fn]) -> _Fn:
    # One flat closure per chain, however long: a left-nested `or` of 5,000 terms would overflow the stack when
    # a request is decided (issue 19.7). Two terms, the common case, skip the loop.
    if len(checks) == 2:
        left, right = checks
        return lambda answers: left(answers) or right(answers)
    return lambda answers: any(check(answers) for check in checks)


def _all(checks: list[_Fn]) -> _Fn:
    if len(checks) == 2:
        left, right = checks
        return lambda answers: left(answers) and right(answers)
    return lambda answers: all(check(answers) for check in checks)


def _negate(inner: _Fn) -> _Fn:
    return lambda answers: not inner(answers)


def _unknown(what: str, word: str, owner: str, known: Any) -> str:
    """`unknown option 'cod' of choice 'kind'; expected one of 'code', 'chat' (did you mean 'code'?)`."""
    close = difflib.get_close_matches(word, list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    expected = ", ".join(repr(item) for item in known) or "none"
    return f"unknown {what} {word!r}{owner}; expected one of {expected}{hint}"


class _Compiler:
    """Recursive descent over the tokens, type-checking and building closures as it goes."""

    def __init__(self, source: str, questions: Mapping[str, Question]) -> None:
        self.source = source
        self.questions = questions
        self.tokens = tokenize(source)
        self.index = 0
        self.depth = 0
        self.referenced: set[str] = set()

    # --- token helpers -------------------------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.index]

    def error(self, message: str, pos: int | None = None) -> ExpressionError:
        return ExpressionError(message, self.source, self.tok.pos if pos is None else pos)

    def take(self, text: str) -> bool:
        if self.tok.text == text and self.tok.kind in ("op", "keyword"):
            self.index += 1
            return True
        return False

    def expect(self, text: str, after: str) -> None:
        if not self.take(text):
            raise self.error(f"expected {text!r} {after}, found {self._describe(self.tok)}")

    def nest(self, pos: int) -> None:
        """Enter one level of parentheses, `not` or list; refuse more than `MAX_EXPRESSION_DEPTH` (a condition
        nested thousands deep would overflow the parser's stack). The message leaves out the source, which can be
        as long as the file."""
        self.depth += 1
        if self.depth > MAX_EXPRESSION_DEPTH:
            raise ExpressionError(
                f"the condition nests deeper than {MAX_EXPRESSION_DEPTH} levels (at character {pos + 1});"
                " use fewer parentheses, `not`s or brackets, e.g. `a and b and c` needs none",
                self.source,
                pos,
                show_source=False,
            )

    @staticmethod
    def _describe(tok: Token) -> str:
        return "the end of the condition" if tok.kind == "end" else repr(tok.text)

    # --- grammar -------------------------------------------------------------------------------------------
    def compile(self) -> Condition:
        if self.tok.kind == "end":
            raise self.error("the condition is empty; write one, e.g. `jailbreak > 0.9`, or leave out `when`")
        result = self.or_expr()
        if self.tok.kind != "end":
            raise self.error(f"unexpected {self._describe(self.tok)}; expected `and`, `or` or the end")
        self.require_bool(result)
        return result.fn

    def require_bool(self, typed: _Typed) -> None:
        if typed.type != "bool":
            hint = f"; compare it, e.g. `{typed.text} > 0.5`" if typed.type == "number" and typed.text else ""
            raise self.error(f"expected a condition (true or false), found {self.kind_of(typed)}{hint}", typed.pos)

    def or_expr(self) -> _Typed:
        return self.chain("or", self.and_expr, _any)

    def and_expr(self) -> _Typed:
        return self.chain("and", self.not_expr, _all)

    def chain(self, keyword: str, operand: Callable[[], _Typed], combine: Callable[[list[_Fn]], _Fn]) -> _Typed:
        """`a KEYWORD b KEYWORD c ...` built flat, so a long chain needs no recursion to compile or to evaluate."""
        first = operand()
        terms = [first]
        while self.tok.text == keyword and self.tok.kind == "keyword":
            self.index += 1
            term = operand()
            if len(terms) == 1:
                self.require_bool(first)
            self.require_bool(term)
            terms.append(term)
        if len(terms) == 1:
            return first
        return _Typed("bool", combine([term.fn for term in terms]), first.pos)

    def not_expr(self) -> _Typed:
        pos = self.tok.pos
        if self.take("not"):
            self.nest(pos)
            inner = self.not_expr()
            self.depth -= 1
            self.require_bool(inner)
            return _Typed("bool", _negate(inner.fn), pos)
        return self.comparison()

    def comparison(self) -> _Typed:
        left = self.operand()
        links: list[tuple[str, _Typed, _Typed]] = []
        while True:
            tok = self.tok
            if tok.kind == "op" and tok.text in _COMPARE:
                self.index += 1
                op = tok.text
            elif tok.kind == "keyword" and tok.text == "in":
                self.index += 1
                op = "in"
            elif tok.kind == "keyword" and tok.text == "not" and self.tokens[self.index + 1].text == "in":
                self.index += 2
                op = "not in"
            else:
                break
            if self.tok.kind == "end":
                raise self.error(f"expected a value after {op!r}")
            right = self.operand()
            self.check_comparison(op, left, right, tok.pos)
            links.append((op, left, right))
            left = right
        if not links:
            return left
        checks = [self.link(op, lhs, rhs) for op, lhs, rhs in links]
        if len(checks) == 1:
            return _Typed("bool", checks[0], links[0][1].pos)
        return _Typed("bool", _all(checks), links[0][1].pos)

    @staticmethod
    def link(op: str, lhs: _Typed, rhs: _Typed) -> _Fn:
        lf, rf = lhs.fn, rhs.fn
        if op == "in":
            return lambda a: lf(a) in rf(a)
        if op == "not in":
            return lambda a: lf(a) not in rf(a)
        cmp = _COMPARE[op]
        if rhs.is_const:  # the common case, `kind == "code"`: skip a call
            value = rhs.const
            return lambda a: cmp(lf(a), value)
        return lambda a: cmp(lf(a), rf(a))

    def kind_of(self, typed: _Typed) -> str:
        what = f" ({typed.what})" if typed.what else ""
        return {"number": "a number", "string": "a string", "bool": "a condition", "list": "a list"}[typed.type] + what

    def check_comparison(self, op: str, left: _Typed, right: _Typed, pos: int) -> None:
        if op in ("in", "not in"):
            if right.type != "list":
                raise self.error(
                    f'{op!r} needs a list on its right, e.g. ["code", "math"]; found {self.kind_of(right)}', right.pos
                )
            if left.type != "string" or any(not isinstance(item, str) for item in right.const):
                raise self.error(
                    f"{op!r} compares a choice's pick with a list of option names; found {self.kind_of(left)}", left.pos
                )
            for item in right.const:
                self.check_option(left, item, right.pos)
            return
        if left.type != right.type or left.type == "list":
            hint = ""
            for this, other in ((left, right), (right, left)):
                if this.type == "number" and other.is_const and other.type == "string" and this.text and not this.owner:
                    hint = f"; for a level's or option's probability write e.g. `{this.text}.{other.const} > 0.5`"
            raise self.error(f"cannot compare {self.kind_of(left)} with {self.kind_of(right)}{hint}", pos)
        if left.type in ("string", "bool") and op not in ("==", "!="):
            raise self.error(f"{op!r} compares numbers; {self.kind_of(left)} takes only '==' or '!='", pos)
        if left.type == "string":
            if left.is_const and right.is_const:
                raise self.error("this compares two strings; name a question on one side", pos)
            for this, other in ((left, right), (right, left)):
                if other.is_const:
                    self.check_option(this, other.const, other.pos)

    def check_option(self, pick: _Typed, option: str, pos: int) -> None:
        if pick.options is not None and option not in pick.options:
            raise self.error(_unknown("value", option, f" of {pick.owner}", pick.options), pos)
        if pick.choice is None:
            return
        question = self.questions[pick.choice]
        if not isinstance(question, Choice):  # `choice` is only set for choices
            return
        if option not in question.options:
            raise self.error(_unknown("option", option, f" of choice {pick.choice!r}", question.options), pos)

    def operand(self) -> _Typed:
        tok = self.tok
        if tok.kind == "number" or (tok.text == "-" and self.tokens[self.index + 1].kind == "number"):
            sign = -1.0 if self.take("-") else 1.0
            value = sign * float(self.tok.text)
            self.index += 1
            return _constant("number", value, tok.pos)
        if tok.kind == "string":
            self.index += 1
            text = unquote(tok.text)
            return _constant("string", text, tok.pos)
        if tok.kind == "keyword" and tok.text in ("true", "false"):
            self.index += 1
            flag = tok.text == "true"
            return _constant("bool", flag, tok.pos)
        if self.take("("):
            self.nest(tok.pos)
            inner = self.or_expr()
            self.expect(")", "to close '('")
            self.depth -= 1
            return inner
        if self.take("["):
            self.nest(tok.pos)
            items = self.list_literal(tok.pos)
            self.depth -= 1
            return items
        if tok.kind == "name":
            return self.reference()
        if tok.kind == "end":
            raise self.error("the condition ends too early; expected a value")
        raise self.error(f"unexpected {self._describe(tok)}; expected a question name, a number or a string")

    def list_literal(self, pos: int) -> _Typed:
        items: list[Any] = []
        while not self.take("]"):
            item = self.operand()
            if not item.is_const or item.type not in ("string", "number"):
                raise self.error("a list holds only strings or numbers", item.pos)
            items.append(item.const)
            if not self.take(","):
                self.expect("]", "to close '['")
                break
        typed = _constant("list", frozenset(items), pos)
        return _Typed("list", typed.fn, pos, tuple(items), True)

    def reference(self) -> _Typed:
        tok = self.tok
        name = tok.text
        self.index += 1
        question = self.questions.get(name)
        if question is None and name in SCOPES:
            return self.fact(name, tok.pos)
        if question is None:
            raise self.error(_unknown("question", name, "", self.questions), tok.pos)
        self.referenced.add(name)
        attr_pos = self.tok.pos
        if self.take("."):
            if self.tok.kind not in ("name", "keyword"):
                raise self.error(f"expected an option name after '{name}.'")
            attr = self.tok.text
            self.index += 1
            if attr == "confidence":
                what = f"the confidence of {name!r}"
                return _Typed("number", lambda a: a[name].confidence, tok.pos, what=what, text=f"{name}.confidence")
            return self.probability(name, question, attr, tok.pos, attr_pos + 1)
        if self.take("["):
            if self.tok.kind != "string":
                raise self.error(f"expected a quoted option name inside {name}[...]")
            attr = unquote(self.tok.text)
            self.index += 1
            self.expect("]", "to close '['")
            return self.probability(name, question, attr, tok.pos, attr_pos + 1)
        if isinstance(question, Choice):
            return _Typed("string", lambda a: a[name].choice, tok.pos, choice=name, what=f"the pick of choice {name!r}")
        if isinstance(question, Noul):
            return _Typed("number", lambda a: a[name].noul, tok.pos, what=f"P(yes) of noul {name!r}", text=name)
        what = f"the expected level of score {name!r}, 0 to {len(question.levels) - 1}"
        return _Typed("number", lambda a: a[name].score, tok.pos, what=what, text=name)

    def fact(self, scope: str, start: int) -> _Typed:
        """`scope.attr`: a fact the router computes (`request.tokens`), typed as `FACTS` says."""
        if not self.take(".") or self.tok.kind not in ("name", "keyword"):
            raise self.error(f"expected a fact after {scope!r}, e.g. `{scope}.{_example(scope)}`")
        key = f"{scope}.{self.tok.text}"
        fact = FACTS.get(key)
        if fact is None:
            known = [name for name in FACTS if name.startswith(f"{scope}.")]
            raise self.error(_unknown("fact", key, "", known), start)
        self.index += 1
        self.referenced.add(key)
        return _Typed(fact.type, lambda a: a[key], start, options=fact.options, owner=f"fact {key!r}",
                      what=f"the fact {key!r}", text=key)  # fmt: skip

    def probability(self, name: str, question: Question, option: str, start: int, pos: int) -> _Typed:
        """`name.option` or `name["option"]`: an option's (or level's) probability; `pos` is the option's."""
        text = f"{name}.{option}" if re.fullmatch(r"[A-Za-z_]\w*", option) else f"{name}[{option!r}]"
        what = f"the probability of {text}"
        if isinstance(question, Choice):
            if option not in question.options:
                raise self.error(_unknown("option", option, f" of choice {name!r}", question.options), pos)
            return _Typed("number", lambda a: a[name].probabilities[option], start, what=what, text=text)
        if isinstance(question, Noul):
            if option not in ("yes", "no"):
                raise self.error(f"a noul has the options 'yes' and 'no', not {option!r}", pos)
            if option == "yes":
                return _Typed("number", lambda a: a[name].noul, start, what=what, text=text)
            return _Typed("number", lambda a: 1.0 - a[name].noul, start, what=what, text=text)
        if not isinstance(question, Score):  # the union has three members
            raise self.error(f"{name!r} is not a question with options", pos)
        if option not in question.levels:
            raise self.error(_unknown("level", option, f" of score {name!r}", question.levels), pos)
        index = question.levels.index(option)
        return _Typed("number", lambda a: a[name].probabilities[index], start, what=what, text=text)


def _example(scope: str) -> str:
    return next(name for name in FACTS if name.startswith(f"{scope}.")).split(".", 1)[1]


def compile_condition(source: str, questions: Mapping[str, Question]) -> tuple[Condition, frozenset[str]]:
    """Compile `source` against `questions` and the facts; return the condition and the question ids and fact
    names it reads.

    >>> cond, names = compile_condition('jailbreak > 0.9', {"jailbreak": Noul("Jailbreak?")})
    >>> sorted(names)
    ['jailbreak']
    """
    compiler = _Compiler(source, questions)
    return compiler.compile(), frozenset(compiler.referenced)
