"""Configuration: packaged defaults (the paper's Table I), a user YAML/TOML file, and overrides.

Resolution order: ``configs/default.yaml`` < user file < ``key.path=value`` overrides.
Override values are parsed as YAML scalars, so ``fl.lr=0.01`` gives a float and
``data.poison.backdoor_clients=[3]`` a list.

:func:`load_config` returns one validated :class:`Config`: the schema is default.yaml itself
(every key, its type from its default, nullability from its comment) plus the ranges, choices
and cross-key rules below, checked by the one validator :func:`check_config`. A ``Config`` is
read by attribute (``cfg.fl.lr``, ``cfg.data.poison.target_label``); it is also the nested
mapping (``cfg["fl"]["lr"]``) that the readers of raw saved config.yaml files still use (and
``scale["lambda"]``, a Python keyword). :func:`config_section` completes a partial section (a
library caller's mapping) from default.yaml, so no reader keeps defaults of its own.
"""

from __future__ import annotations

import copy
import difflib
import functools
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from scaleflu import plugins
from scaleflu.errors import ConfigError
from scaleflu.plugins import is_plugin_file, load_plugins

PACKAGED_DIR = Path(__file__).with_name("configs")
DEFAULTS_PATH = PACKAGED_DIR / "default.yaml"


@functools.cache
def _loader() -> type:
    """Safe YAML loader that also reads ``1e-3`` and ``1.0e12`` as floats (YAML 1.2 style).

    PyYAML follows YAML 1.1, where an exponent needs a dot and a sign, so ``fl.lr=1e-3`` would
    silently become the string "1e-3". Built on first use: ``scaleflu --help`` imports no yaml.
    On libyaml's parser where PyYAML has it: the same documents, about nine times faster (the
    packaged defaults in 3 ms instead of 23 ms).
    """
    import yaml

    class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
        pass

    _Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(
            r"""^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)
            |[-+]?(?:[0-9][0-9_]*)\.[0-9_]*
            |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
            |[-+]?\.(?:inf|Inf|INF)
            |\.(?:nan|NaN|NAN))$""",
            re.X,
        ),
        list("-+0123456789."),
    )
    return _Loader


def yaml_load(text: str) -> Any:
    """Parse YAML safely (no code, no arbitrary objects), with YAML 1.2 floats."""
    import yaml

    return yaml.load(text, Loader=_loader())  # noqa: S506 - a SafeLoader


class Section(dict):
    """A validated config section: attribute access (``cfg.fl.lr``) over the mapping.

    An unknown attribute is an error naming the closest key (``did you mean``). A key that is
    a Python keyword (``scale.lambda``) is read as ``cfg.scale["lambda"]``.
    """

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            if name.startswith("__"):
                raise AttributeError(name) from None
            close = difflib.get_close_matches(name, [str(k) for k in self], n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise AttributeError(f"config has no key {name!r}{hint}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self:
            raise AttributeError(f"config has no key {name!r}")
        self[name] = value

    def __setitem__(self, key: str, value: Any) -> None:
        # a mapping stored into a section becomes a Section: cfg.scale = {...}; cfg.scale.top_m
        super().__setitem__(key, _typed(value))

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts (for YAML, JSON and comparisons)."""
        return {
            k: v.to_dict() if isinstance(v, Section) else copy.deepcopy(v) for k, v in self.items()
        }


class Config(Section):
    """The whole validated configuration (:func:`load_config`, :func:`as_config`)."""

    __slots__ = ()


def _typed(value: Any) -> Any:
    if isinstance(value, Mapping) and not isinstance(value, Section):
        return Section({k: _typed(v) for k, v in value.items()})
    return value


@functools.cache
def _yaml_knows_sections() -> None:
    """``yaml.safe_dump`` writes a Section as the plain mapping it is (registered on first use)."""
    import yaml

    yaml.SafeDumper.add_multi_representer(Section, yaml.SafeDumper.represent_dict)


def as_config(cfg: Mapping[str, Any]) -> Config:
    """Check a full config mapping (e.g. a run's saved config.yaml) and return it as a Config."""
    _yaml_knows_sections()
    check_config(cfg)
    if isinstance(cfg, Config):
        return cfg
    return Config({k: _typed(v) for k, v in cfg.items()})


def config_section(path: str, value: Mapping[str, Any] | None) -> Section:
    """One section of the config (``"data"``, ``"data.poison"``, ``"fl"``) as a checked Section.

    A :class:`Section` (a part of a loaded :class:`Config`) is returned as it is. A plain mapping
    (a library caller's or a test's partial section) is merged onto that section's defaults in
    default.yaml and checked like a full config: the defaults live in one place, never as
    ``.get(key, default)`` fall-backs in the code that reads them.
    """
    if isinstance(value, Section):
        return value
    parts = path.split(".")
    node: Any = default_config()
    for p in parts:
        node = node[p]
    merged = merge(node, value or {}, path + ".")
    nested: dict[str, Any] = merged
    for p in reversed(parts):
        nested = {p: nested}
    check_config(nested)
    return _typed(merged)


def default_config() -> dict[str, Any]:
    """The packaged defaults as a fresh nested dict (parsed once per process)."""
    return copy.deepcopy(_parsed_defaults())


@functools.cache
def _parsed_defaults() -> dict[str, Any]:
    return yaml_load(DEFAULTS_PATH.read_text())


def packaged_configs() -> list[str]:
    """Names of the configs shipped with the package (``table2_cpu``, ...)."""
    return sorted(p.stem for p in PACKAGED_DIR.glob("*.yaml") if p.stem != "default")


def resolve_config_path(path: str | Path | None) -> Path | None:
    """A config path as given, or a packaged config by name (``table2_cpu``, ``table2_cpu.yaml``).

    A file that exists wins over a packaged name. Raises :class:`ConfigError` when neither exists.
    """
    if path is None:
        return None
    path = Path(path)
    if path.is_file():
        return path
    if path.parent == Path("."):
        for cand in (PACKAGED_DIR / path.name, PACKAGED_DIR / f"{path.name}.yaml"):
            if cand.is_file() and cand.name != "default.yaml":
                return cand
    names = ", ".join(packaged_configs())
    raise ConfigError(f"config file not found: {path} (packaged configs: {names})")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML or TOML config file (a packaged config by name too), unchecked.

    An unparsable file is a one-line :class:`ConfigError` naming it and the place.
    """
    path = Path(path)
    path = resolve_config_path(path) or path
    text = path.read_text()
    import yaml

    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml_load(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"cannot parse config {path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"cannot parse config {path}{where}: {what}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config {path} must hold a mapping at top level, got {type(data).__name__}"
        )
    if isinstance(data.get("plugins"), list):  # plugin files beside the config that names them
        data["plugins"] = [absolute_plugin(p, path.parent) for p in data["plugins"]]
    return data


_read_file = read_config_file  # the name older callers use


def merge(base: dict[str, Any], update: Mapping[str, Any], _path: str = "") -> dict[str, Any]:
    """Deep-merge ``update`` into a copy of ``base``; unknown keys are an error (catches typos)."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        where = f"{_path}{key}"
        if key not in out:
            close = difflib.get_close_matches(str(key), [str(k) for k in out], n=1, cutoff=0.6)
            hint = f" (did you mean {_path}{close[0]}?)" if close else ""
            raise ConfigError(f"unknown config key: {where}{hint}")
        if isinstance(out[key], dict) and isinstance(value, Mapping):
            out[key] = merge(out[key], value, where + ".")
        elif isinstance(out[key], dict):
            raise ConfigError(f"config key {where} must be a mapping")
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_override(text: str) -> dict[str, Any]:
    """Turn ``a.b.c=value`` into ``{"a": {"b": {"c": value}}}``."""
    if "=" not in text:
        raise ConfigError(f"override must look like key.path=value, got {text!r}")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"override has an empty key: {text!r}")
    import yaml

    try:
        value = yaml_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"cannot parse override value in {text!r}: {exc}") from exc
    nested: dict[str, Any] = {parts[-1]: value}
    for part in reversed(parts[:-1]):
        nested = {part: nested}
    return nested


def load_config(
    path: str | Path | None = None, overrides: Iterable[str] = (), plugins: Iterable[str] = ()
) -> Config:
    """Defaults, merged with the file at ``path`` (YAML or TOML), then with each override.

    ``plugins`` (``--plugin``) are added to the config's ``plugins`` list (a file path made
    absolute). Returns the validated :class:`Config`; raises :class:`ConfigError` (one line
    naming the key) on an unknown key, a wrong type, a value out of range or a broken cross-key
    rule.
    """
    cfg = default_config()
    if path is not None:
        cfg = merge(cfg, _read_file(Path(path)))
    for item in overrides:
        cfg = merge(cfg, parse_override(item))
    extra = [absolute_plugin(p) for p in plugins]
    if extra:
        have = list(cfg.get("plugins") or [])
        cfg["plugins"] = have + [p for p in extra if p not in have]
    return as_config(cfg)


def absolute_plugin(spec: str, base: str | Path | None = None) -> str:
    """A plugin spec with a file path made absolute (relative to ``base``, default the current
    folder), so a run's saved config finds it from anywhere; a module name as it is."""
    if not is_plugin_file(spec):
        return spec
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = Path(base or ".") / path
    return str(path.resolve())


# ----------------------------------------------------------------------------- checking
#
# Types come from default.yaml itself, so a key added there is checked without code changes:
# a leaf takes the type of its default (an int default wants an int, a float default an int or
# a float, a bool a bool, a string a string, a list a list). A key may be null when its default
# is null or when its comment in default.yaml says what null means ("# null: ..."). Keys whose
# default is null take the type below when set; a null-default key not listed is not
# type-checked. Ranges and choices are the small tables below.

NULL_DEFAULT_TYPES: dict[str, type | tuple[type, ...]] = {
    "data.root": str,
    "data.train_subset": int,
    "data.test_subset": int,
    "fl.ray_address": str,
    "fl.ray_num_cpus": int,
    "fl.eval_batch_size": int,
    "history.keep_rounds": int,
    "scale.recovery_local_epochs": int,
    "scale.heal_lr": (int, float),
    "testbed.max_update_norm": (int, float),
    "testbed.arq.window": int,
    "testbed.arq.initial_rto": (int, float),
    "testbed.arq.rate_bytes_per_s": (int, float),
    "testbed.arq.reassembly_max_bytes_untrusted": int,
    "testbed.airtime.bytes": int,
    "testbed.mac.turnaround_s": (int, float),
    "testbed.mac.guard_s": (int, float),
    "baselines.retrain.rounds": int,
    "baselines.retrain.seed": int,
    "scale.eval.audit.rounds": int,
    "scale.forget_lr": (int, float),
    "baselines.scale.mode": str,
    "baselines.pga.batch_size": int,
    "baselines.pga.radius": (int, float),
    "baselines.fused.alpha": (int, float),
    "baselines.fused.local_epochs": int,
    "baselines.fused.lr": (int, float),
    "experiment.alpha_sweep.models": list,
}

# key: (low, high); None is unbounded; "low<" / "<high" in RANGE_OPEN make that end strict.
RANGES: dict[str, tuple[float | None, float | None]] = {
    "seed": (0, None),
    "baselines.retrain.rounds": (1, None),
    "baselines.retrain.seed": (0, None),
    "data.num_clients": (1, None),
    "data.alpha": (0, None),
    "data.train_subset": (1, None),
    "data.test_subset": (1, None),
    "data.poison.backdoor_fraction": (0, 1),
    "data.poison.label_flip_fraction": (0, 1),
    "data.poison.target_label": (0, None),
    "data.poison.trigger_size": (1, None),
    "data.poison.canaries": (0, None),
    "data.poison.canary_copies": (1, None),
    "fl.rounds": (1, None),
    "fl.local_epochs": (1, None),
    "fl.lr": (0, None),
    "fl.lr_decay": (0, 1),
    "fl.lr_min_ratio": (0, 1),
    "fl.batch_size": (1, None),
    "fl.clients_per_round": (1, None),
    "fl.momentum": (0, 1),
    "fl.eval_every": (1, None),
    "fl.eval_batch_size": (1, None),
    "fl.threads": (0, None),
    "fl.workers": (1, None),
    "fl.bn_recalibration": (0, None),
    "fl.ray_num_cpus": (1, None),
    "fl.ray_cpus_per_client": (1, None),
    "history.keep_rounds": (1, None),
    "history.link_goodput": (0, None),
    "history.link_latency": (0, None),
    "history.link_snr_db": (-20, 80),
    "history.update_tol": (0, None),
    "scale.groups_per_layer": (1, None),
    "scale.top_m": (1, None),
    "scale.eval.canary_min": (1, None),
    "scale.eval.audit.shadows": (0, None),
    "scale.eval.audit.rounds": (1, None),
    "scale.eval.audit.bootstrap": (0, None),
    "scale.eval.audit.ci": (0, 1),
    "scale.ppo.episodes": (1, None),
    "scale.ppo.epochs": (1, None),
    "scale.ppo.n_steps": (1, None),
    "scale.ppo.batch_size": (1, None),
    "testbed.robots": (1, None),
    "testbed.rounds": (1, None),
    "testbed.min_robots": (1, None),
    "testbed.broadcast_stall_passes": (1, None),
    "testbed.broadcast_stall_s": (0, None),
    "testbed.airtime.window_s": (0, None),
    "testbed.airtime.bytes": (1, None),
    "testbed.arq.reassembly_max_bytes_untrusted": (1, None),
    "testbed.medium.snr_db": (-20, 80),
    "testbed.medium.k_factor_db": (-30, 60),
    "testbed.medium.doppler_hz": (0, 1000),
    "testbed.medium.block": (256, 1048576),
    "testbed.medium.idle_blocks": (1, None),
    "testbed.medium.deaf_blocks": (1, None),
    "testbed.medium.node_timeout_s": (1, None),
}
RANGE_OPEN: set[str] = {
    "data.alpha<",
    "scale.eval.audit.ci<",
    "scale.eval.audit.ci>",
    "fl.lr<",
    "fl.lr_decay<",
    "fl.momentum>",
    "history.link_goodput<",
    "testbed.airtime.window_s<",
}

# Nullable keys whose comment does not say so (null switches the feature off).
NULLABLE_EXTRA: frozenset[str] = frozenset({"scale.budget"})

# the MCS table's names (scaleflu.link.mcs, which the configuration does not import: a test
# checks the two agree)
_MCS_NAMES = (
        "bpsk-1/2",
        "bpsk-3/4",
        "qpsk-1/2",
        "qpsk-3/4",
        "16qam-1/2",
        "16qam-3/4",
        "64qam-2/3",
        "64qam-3/4",
        "qpsk-uncoded",
)  # fmt: skip

CHOICES: dict[str, tuple[str, ...]] = {
    "data.dataset": plugins.BUILTIN_DATASETS,  # scaleflu.fl.data.DATASET_NAMES
    "model.name": plugins.BUILTIN_MODELS,  # scaleflu.fl.models.MODEL_NAMES
    "data.partition": ("iid", "dirichlet"),
    "fl.backend": ("local", "ray"),
    "fl.trainer": ("auto", "vmap", "sequential"),
    "fl.lr_schedule": ("constant", "exponential", "cosine"),
    "scale.mode": ("default", "paper"),
    "scale.heal_loss": ("ce", "distill", "distill_class"),
    "scale.heal_augment": ("none", "mix"),
    "scale.forget_saliency_stat": ("loss", "margin"),
    "scale.heal_params": ("all", "layers", "cut", "uncut"),
    "testbed.medium.fading": ("none", "rayleigh", "rician"),
    # scaleflu.link.mcs: the link kinds' PHY, and the MCS names of table version 1
    "history.link_fading": ("none", "rician", "rayleigh"),
    "history.link_phy": ("adaptive", "auto", "stock", *_MCS_NAMES),
    "testbed.mcs": ("adaptive", "auto", "stock", "none", *_MCS_NAMES),
    "baselines.scale.mode": ("default", "paper"),
    "experiment.scale_mode": ("default", "paper"),
}


_PLUGGABLE = ("model.name", "data.dataset")  # choices a plugin may add to (scaleflu.plugins)


def _plugin_choice(key: str, value: Any) -> bool:
    """Whether a registered plugin provides ``value`` for ``key`` (model.name, data.dataset)."""
    if key not in _PLUGGABLE or not isinstance(value, str):
        return False
    found = plugins.model_builder if key == "model.name" else plugins.dataset_loader
    return found(value) is not None


@functools.lru_cache(maxsize=1)
def nullable_keys() -> frozenset[str]:
    """Keys of default.yaml that may be null: null by default, or "null" in their comment."""
    out: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indent, key) of the open mappings
    last_leaf: str | None = None
    line_re = re.compile(r"^(\s*)([A-Za-z_][\w-]*):\s*([^#]*?)\s*(?:#(.*))?$")
    for line in DEFAULTS_PATH.read_text().splitlines():
        m = line_re.match(line)
        if not m:
            # a comment-only line continues the comment of the leaf above it
            if last_leaf and line.strip().startswith("#") and re.search(r"\bnull\b", line):
                out.add(last_leaf)
            continue
        indent, key, value, comment = len(m.group(1)), m.group(2), m.group(3), m.group(4) or ""
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([*(k for _, k in stack), key])
        if value == "":
            stack.append((indent, key))
            last_leaf = None
            continue
        last_leaf = path
        if value == "null" or re.search(r"\bnull\b", comment):
            out.add(path)
    return frozenset(out | NULLABLE_EXTRA)


def _type_name(t: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    names[list] = "a list"
    if isinstance(t, tuple):
        return " or ".join(names.get(x, x.__name__) for x in t)
    return names.get(t, t.__name__)


def _expected_type(default: Any, key: str) -> type | tuple[type, ...] | None:
    if default is None:
        return NULL_DEFAULT_TYPES.get(key)
    if isinstance(default, bool):
        return bool
    if isinstance(default, int):
        return int
    if isinstance(default, float):
        return (int, float)
    if isinstance(default, str):
        return str
    if isinstance(default, list):
        return list
    return None


def _check_leaf(key: str, value: Any, default: Any) -> None:
    if value is None:
        if default is not None and key not in nullable_keys():
            raise ConfigError(f"{key} may not be null")
        return
    want = _expected_type(default, key)
    if want is not None:
        wrong_bool = isinstance(value, bool) and want is not bool
        if wrong_bool or not isinstance(value, want):
            raise ConfigError(
                f"{key} must be {_type_name(want)}, got {value!r} ({type(value).__name__})"
            )
        if isinstance(value, float) and value != value:
            raise ConfigError(f"{key} must be a number, got nan")
    if key in CHOICES and value not in CHOICES[key] and not _plugin_choice(key, value):
        extra = " or a plugin's (plugins: [...], see scaleflu.plugins)" if key in _PLUGGABLE else ""
        raise ConfigError(f"{key} must be one of {', '.join(CHOICES[key])}{extra}, got {value!r}")
    if key in RANGES and isinstance(value, int | float) and not isinstance(value, bool):
        lo, hi = RANGES[key]
        lo_open, hi_open = f"{key}<" in RANGE_OPEN, f"{key}>" in RANGE_OPEN
        bad = (lo is not None and (value <= lo if lo_open else value < lo)) or (
            hi is not None and (value >= hi if hi_open else value > hi)
        )
        if bad:
            if hi is None:
                rng = f"{'>' if lo_open else '>='} {lo:g}"
            elif lo is None:
                rng = f"{'<' if hi_open else '<='} {hi:g}"
            else:
                rng = f"in [{lo:g}, {hi:g}{')' if hi_open else ']'}"
            raise ConfigError(f"{key} must be {rng}, got {value!r}")


def check_config(cfg: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> None:
    """Check every leaf of ``cfg`` against default.yaml's types, nullability, ranges, choices.

    Raises :class:`ConfigError` with one line naming the key. Keys absent from the defaults are
    rejected by :func:`merge` before this runs.
    """
    defaults = default_config() if defaults is None else defaults
    plugins = cfg.get("plugins")
    if plugins:  # before the choices below: they register models and data sets
        if not isinstance(plugins, list):
            raise ConfigError(f"plugins must be a list of modules or .py files, got {plugins!r}")
        load_plugins(plugins)

    def walk(node: Mapping[str, Any], ref: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            where = f"{prefix}{key}"
            if key not in ref:
                continue
            if isinstance(ref[key], dict):
                if isinstance(value, Mapping):
                    walk(value, ref[key], where + ".")
                elif value is not None or where not in nullable_keys():
                    raise ConfigError(f"config key {where} must be a mapping")
                continue
            _check_leaf(where, value, ref[key])

    walk(cfg, defaults, "")
    _check_relations(cfg)


def _check_relations(cfg: Mapping[str, Any]) -> None:
    """Rules across keys: selection and poisoned clients within data.num_clients."""
    data, fl = cfg.get("data"), cfg.get("fl")
    if not isinstance(data, Mapping) or not isinstance(data.get("num_clients"), int):
        return
    n = data["num_clients"]
    per_round = fl.get("clients_per_round") if isinstance(fl, Mapping) else None
    if isinstance(per_round, int) and per_round > n:
        raise ConfigError(f"fl.clients_per_round ({per_round}) exceeds data.num_clients ({n})")
    recal = fl.get("bn_recalibration") if isinstance(fl, Mapping) else None
    scale = cfg.get("scale")
    val_size = scale.get("val_size") if isinstance(scale, Mapping) else None
    if isinstance(recal, int) and isinstance(val_size, int) and recal > val_size:
        raise ConfigError(
            f"fl.bn_recalibration ({recal}) exceeds scale.val_size ({val_size}): the server "
            "re-estimates BatchNorm statistics only from its own validation images"
        )
    poison = data.get("poison")
    for key in ("backdoor_clients", "label_flip_clients"):
        clients = (poison.get(key) if isinstance(poison, Mapping) else None) or []
        if not isinstance(clients, list) or not all(
            isinstance(c, int) and not isinstance(c, bool) and 0 <= c < n for c in clients
        ):
            raise ConfigError(
                f"data.poison.{key} must be a list of client ids in 0..{n - 1}, got {clients!r}"
            )


def _plain(node: Any) -> Any:
    if isinstance(node, Mapping):
        return {k: _plain(v) for k, v in node.items()}
    return node


def save_config(cfg: Mapping[str, Any], path: str | Path) -> Path:
    """Write the resolved config as YAML (what every run keeps beside its results)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    import yaml

    plain = cfg.to_dict() if isinstance(cfg, Section) else _plain(cfg)
    path.write_text(yaml.safe_dump(plain, sort_keys=False))
    return path
