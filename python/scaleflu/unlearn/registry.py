"""The one unlearning-method registry: ``{name: Unlearner class}`` with typed hyper-parameters.

Every caller -- ``scaleflu unlearn --method``, ``scaleflu experiment table2``, the testbed's
edge server and the benchmarks -- gets its Unlearner from :func:`make_method`, so a method
name means the same class, the same hyper-parameters and the same ``details`` everywhere.

Hyper-parameters are merged once, in :func:`hyper_parameters`: the packaged
``baselines.<name>`` defaults, then the given config's ``baselines.<name>``, then keyword
overrides; the result is checked against the method's typed parameter schema (a dataclass:
unknown keys, missing keys and wrong types are a :class:`~scaleflu.config.ConfigError`) and
passed to the class as keyword arguments.

Registering a method is one line (the class is imported only when the method is used, so
``scaleflu --help`` does not pay for torch)::

    register("finetune", "scaleflu.unlearn.baselines.finetune:FinetuneUnlearner", FinetuneParams)

With ``params=None`` the keys and types of the method's ``baselines.<name>`` section in
default.yaml are the schema.

:func:`scaleflu.unlearn.run.run_unlearning` is the library entry point: it loads a run,
resolves the config and the request, runs a method of this registry and returns the model state
and the result in memory (the CLI writes them to disk, the edge server deploys them). The
registry itself imports no torch: ``scaleflu unlearn --help`` lists the methods without it.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import logging
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scaleflu.config import ConfigError, default_config

log = logging.getLogger(__name__)

PAPER_MODE_WARNING = (
    "SCALE paper mode prunes the smallest-magnitude weights of the chosen groups (the "
    "authors' Sparsify) and runs no recovery round: it is not expected to forget the request "
    "(measured effect in docs/scale.md); use --mode default to unlearn"
)

# -- typed hyper-parameters -------------------------------------------------------------------


@dataclass(frozen=True)
class RetrainParams:
    """``baselines.retrain``."""

    rounds: int | None  # FedAvg rounds (None: the run's fl.rounds)
    # None: the run's seed, initial model and client selection (the reference); an integer: an
    # independent Retrain (fresh initial model, selection and batch order from this seed), to
    # measure how far two equally valid Retrains lie apart (benchmarks/unlearn_bench.py)
    seed: int | None = None


@dataclass(frozen=True)
class ScaleParams:
    """``baselines.scale`` (SCALE's own settings live in the ``scale`` section)."""

    mode: str | None  # paper | default (None: the context's mode, i.e. scale.mode)

    def __post_init__(self) -> None:
        if self.mode not in (None, "paper", "default"):
            raise ConfigError(f"scale: mode must be paper or default, got {self.mode!r}")


@dataclass(frozen=True)
class FedEraserParams:
    """``baselines.fedraser``."""

    interval: int
    calibration_ratio: float

    def __post_init__(self) -> None:
        if self.interval < 1 or not self.calibration_ratio > 0:
            raise ConfigError("fedraser: interval must be >= 1 and calibration_ratio > 0")


@dataclass(frozen=True)
class PGAParams:
    """``baselines.pga``."""

    lr: float
    momentum: float
    epochs: int
    batch_size: int | None
    clip_grad: float
    radius: float | None
    radius_fraction: float
    radius_models: int
    stop_acc: float
    stop_rule: str
    stop_distance: float | None
    stop_distance_ratio: float
    check_samples: int
    post_rounds: int
    report_pre_post: bool

    def __post_init__(self) -> None:
        if self.stop_rule not in ("reference", "accuracy"):
            raise ConfigError(
                f"pga: stop_rule must be reference or accuracy, got {self.stop_rule!r}"
            )
        if self.epochs < 0 or self.post_rounds < 0 or self.radius_models < 1:
            raise ConfigError("pga: epochs and post_rounds must be >= 0, radius_models >= 1")


@dataclass(frozen=True)
class FusedParams:
    """``baselines.fused``."""

    rank: int
    alpha: float | None
    num_layers: int
    layer_choice: str
    cli_rounds: int
    rounds: int | None
    local_epochs: int | None
    lr: float | None
    max_grad_norm: float | None

    def __post_init__(self) -> None:
        if self.max_grad_norm is not None and not (
            self.max_grad_norm > 0 and math.isfinite(self.max_grad_norm)
        ):
            raise ConfigError(f"fused: max_grad_norm must be > 0 or null, got {self.max_grad_norm}")
        if self.layer_choice not in ("request", "history"):
            raise ConfigError(
                f"fused: layer_choice must be request or history, got {self.layer_choice!r}"
            )
        if self.rank < 1 or self.num_layers < 1 or (self.rounds or 0) < 0:
            raise ConfigError("fused: rank and num_layers must be >= 1, rounds >= 0")


@dataclass(frozen=True)
class FinetuneParams:
    """``baselines.finetune`` (the control and its cost-matched variant)."""

    rounds: int | None  # k (None: scale.recovery_rounds, at least 1)
    local_epochs: int | None  # None: scale.recovery_local_epochs (None there: fl.local_epochs)
    budget_cpu_s: float | None  # finetune_matched: rounds until this much CPU time
    max_rounds: int | None  # cap of the budgeted control (None: fl.rounds)

    def __post_init__(self) -> None:
        if (self.rounds is not None and self.rounds < 1) or (
            self.max_rounds is not None and self.max_rounds < 1
        ):
            raise ConfigError("finetune needs at least one round: rounds, max_rounds >= 1 or null")
        if self.budget_cpu_s is not None and self.budget_cpu_s < 0:
            raise ConfigError(f"finetune: budget_cpu_s must be >= 0, got {self.budget_cpu_s}")


@dataclass(frozen=True)
class NoTParams:
    """``baselines.not`` (NoT, weight negation)."""

    layers: int  # how many of the first Conv/Linear layers are negated (paper: the first)
    negate_bias: bool  # their biases too
    rounds: int  # FedAvg fine-tuning rounds on the retained data
    local_epochs: int | None  # None: fl.local_epochs

    def __post_init__(self) -> None:
        if self.layers < 1 or self.rounds < 0:
            raise ConfigError("not: layers must be >= 1 and rounds >= 0")


# -- the registry -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MethodSpec:
    """One registered method: its class (``module:Class``), parameter schema and aliases."""

    name: str
    target: str
    params: type | None = None
    aliases: tuple[str, ...] = ()
    section: str | None = None  # the baselines.<section> holding its settings (None: name)

    def load(self) -> type:
        """The Unlearner class (imported now)."""
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)


_METHODS: dict[str, MethodSpec] = {}
_ALIASES: dict[str, str] = {}


def register(
    name: str,
    target: str,
    params: type | None = None,
    aliases: tuple[str, ...] = (),
    section: str | None = None,
) -> None:
    """Register ``name`` -> ``module:Class`` (``params``: a dataclass schema of its settings)."""
    key = name.lower()
    if key in _METHODS or key in _ALIASES:
        raise ValueError(f"unlearning method {name!r} is registered twice")
    _METHODS[key] = MethodSpec(key, target, params, tuple(a.lower() for a in aliases), section)
    for a in aliases:
        _ALIASES[a.lower()] = key


register("retrain", "scaleflu.unlearn.retrain:RetrainUnlearner", RetrainParams)
register("scale", "scaleflu.unlearn.scale:ScaleUnlearner", ScaleParams)
register(
    "fedraser",
    "scaleflu.unlearn.baselines.fedraser:FedEraserUnlearner",
    FedEraserParams,
    ("federaser", "fe", "f-e"),
)
register("pga", "scaleflu.unlearn.baselines.pga:PGAUnlearner", PGAParams)
register("fused", "scaleflu.unlearn.baselines.fused:FusedUnlearner", FusedParams)
register(
    "not",
    "scaleflu.unlearn.baselines.negation:NoTUnlearner",
    NoTParams,
    ("weight_negation", "negation"),
)
# the control (no unlearning): k FedAvg rounds of the remaining clients; matched: SCALE's CPU time
register("finetune", "scaleflu.unlearn.baselines.finetune:FinetuneUnlearner", FinetuneParams)
register(
    "finetune_matched",
    "scaleflu.unlearn.baselines.finetune:MatchedFinetuneUnlearner",
    FinetuneParams,
    section="finetune",
)


def method_names() -> tuple[str, ...]:
    """The registered method names, in registration order."""
    return tuple(_METHODS)


def method_aliases() -> dict[str, tuple[str, ...]]:
    """Every registered name with the other names it is also accepted under (may be empty)."""
    return {name: spec.aliases for name, spec in _METHODS.items()}


def canonical_name(name: str) -> str:
    """The registered name for ``name`` or an alias; ValueError for an unknown method."""
    key = str(name).lower()
    key = _ALIASES.get(key, key)
    if key not in _METHODS:
        close = difflib.get_close_matches(key, list(_METHODS) + list(_ALIASES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"unknown unlearning method {name!r}{hint}; choose one of {', '.join(_METHODS)}"
        )
    return key


def method_spec(name: str) -> MethodSpec:
    """The :class:`MethodSpec` of ``name`` (or an alias)."""
    return _METHODS[canonical_name(name)]


def method_class(name: str) -> type:
    """The Unlearner class of ``name`` (or an alias)."""
    return method_spec(name).load()


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """``value`` as the annotated type (int, float, bool, str, or ``X | None``)."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], where)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    else:
        return value
    raise ConfigError(f"{where} must be {getattr(hint, '__name__', hint)}, got {value!r}")


def _typed(schema: type, values: Mapping[str, Any], where: str) -> dict[str, Any]:
    hints = typing.get_type_hints(schema)
    names = [f.name for f in dataclasses.fields(schema)]
    for key in values:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown key {where}.{key}{hint}")
    missing = [n for n in names if n not in values]
    if missing:
        raise ConfigError(f"{where} lacks {', '.join(missing)} (see default.yaml)")
    typed = {n: _coerce(values[n], hints[n], f"{where}.{n}") for n in names}
    return dataclasses.asdict(schema(**typed))


def _untyped(name: str, values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Checked against the default section's keys and value types (methods without a schema)."""
    defaults = (default_config().get("baselines") or {}).get(name) or {}
    out = {}
    for key, value in values.items():
        if key not in defaults:
            close = difflib.get_close_matches(str(key), list(defaults), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown key {where}.{key}{hint}")
        ref = defaults[key]
        if ref is not None and value is not None:
            value = _coerce(value, float if isinstance(ref, float) else type(ref), where + key)
        out[key] = value
    return out


def hyper_parameters(
    name: str, cfg: Mapping[str, Any] | None = None, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Defaults, then ``cfg``'s ``baselines.<name>``, then ``overrides``; typed and checked."""
    spec = method_spec(name)
    sec = spec.section or spec.name
    values = copy.deepcopy(dict((default_config().get("baselines") or {}).get(sec) or {}))
    if cfg is not None:
        section = (cfg.get("baselines") or {}).get(sec)
        if section is not None and not isinstance(section, Mapping):
            raise ConfigError(f"baselines.{sec} must be a mapping, got {section!r}")
        values.update(copy.deepcopy(dict(section or {})))
    values.update(copy.deepcopy(dict(overrides or {})))
    where = f"baselines.{sec}"
    if spec.params is None:
        return _untyped(sec, values, where)
    return _typed(spec.params, values, where)


def make_method(name: str, cfg: Mapping[str, Any] | None = None, **overrides: Any) -> Any:
    """The Unlearner for ``name`` with its hyper-parameters (see :func:`hyper_parameters`).

    ``cfg`` (a resolved config) supplies ``baselines.<name>``; keyword ``overrides`` win (for
    ``scale``: ``mode``; for ``retrain``: ``rounds``, ``seed``).
    """
    spec = method_spec(name)
    return spec.load()(**hyper_parameters(spec.name, cfg, overrides))
