"""The YAML policy language: configuration schema, `when` conditions, evaluation and policy test cases.

    >>> from policies import load_config
    >>> config = load_config("examples/routing.yaml")
    >>> sorted(config.policies)
    ['auto']

Pure: reads its files and nothing else.
"""

from policies._access import AuthSettings, BudgetSpec, ClientKeySpec, GroupSpec, RateSpec, TokenRateSpec
from policies._answer import AnswerGuard, AnswerVerdict, Replace
from policies._errors import ConfigError, EvaluationError, Issue, PolicyError
from policies._expr import Condition, compile_condition
from policies._facts import FACTS, Fact, Facts, FactValue
from policies._keys import load_keys
from policies._lexer import ExpressionError
from policies._load import Config, build_question, load_config, parse_config
from policies._params import API_TITLES, APIS, PARAMS, TRANSLATIONS, ApiName, param_path, translatable
from policies._policy import (
    Action,
    Block,
    Decision,
    OverlapSettings,
    Policy,
    Route,
    Rule,
    SessionSettings,
    StateSettings,
    Step,
)
from policies._reference import reference_markdown
from policies._schema import (
    CacheSettings,
    ConfigSpec,
    DecisionsSettings,
    EmbeddedSettings,
    EngineSettings,
    PoolEngineSettings,
    PriceSpec,
    QuestionSpec,
    RemoteSettings,
    ServerSettings,
    SessionServerSettings,
    UpstreamSettings,
)
from policies._testing import PolicyTest, TestResult, run_test

__all__ = [
    "APIS",
    "API_TITLES",
    "FACTS",
    "PARAMS",
    "TRANSLATIONS",
    "Action",
    "AnswerGuard",
    "AnswerVerdict",
    "ApiName",
    "AuthSettings",
    "Block",
    "BudgetSpec",
    "CacheSettings",
    "ClientKeySpec",
    "Condition",
    "Config",
    "ConfigError",
    "ConfigSpec",
    "Decision",
    "DecisionsSettings",
    "EmbeddedSettings",
    "EngineSettings",
    "EvaluationError",
    "ExpressionError",
    "Fact",
    "FactValue",
    "Facts",
    "GroupSpec",
    "Issue",
    "OverlapSettings",
    "Policy",
    "PolicyError",
    "PolicyTest",
    "PoolEngineSettings",
    "PriceSpec",
    "QuestionSpec",
    "RateSpec",
    "RemoteSettings",
    "Replace",
    "Route",
    "Rule",
    "ServerSettings",
    "SessionServerSettings",
    "SessionSettings",
    "StateSettings",
    "Step",
    "TestResult",
    "TokenRateSpec",
    "UpstreamSettings",
    "build_question",
    "compile_condition",
    "load_config",
    "load_keys",
    "param_path",
    "parse_config",
    "reference_markdown",
    "run_test",
    "translatable",
]
