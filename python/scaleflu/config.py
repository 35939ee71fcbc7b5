"""Configuration: packaged defaults (the paper's Table I), a user YAML/TOML file, and overrides.

Resolution order: ``configs/default.yaml`` < user file < ``key.path=value`` overrides.
Override values are parsed as YAML scalars, so ``fl.lr=0.01`` gives a float and
``data.poison.backdoor_clients=[3]`` a list.
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

PACKAGED_DIR = Path(__file__).with_name("configs")
DEFAULTS_PATH = PACKAGED_DIR / "default.yaml"


class _Loader(yaml.SafeLoader):
    """Safe YAML loader that also reads ``1e-3`` and ``1.0e12`` as floats (YAML 1.2 style).

    PyYAML follows YAML 1.1, where an exponent needs a dot and a sign, so ``fl.lr=1e-3`` would
    silently become the string "1e-3".
    """


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


def yaml_load(text: str) -> Any:
    """Parse YAML safely (no code, no arbitrary objects), with YAML 1.2 floats."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader


class ConfigError(ValueError):
    """A configuration file or override is malformed or holds an invalid value."""


def default_config() -> dict[str, Any]:
    """The packaged defaults as a fresh nested dict."""
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


def _read_file(path: Path) -> dict[str, Any]:
    path = resolve_config_path(path) or path
    text = path.read_text()
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot parse config {path}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"config {path} must hold a mapping at top level, got {type(data).__name__}"
        )
    return data


def merge(base: dict[str, Any], update: Mapping[str, Any], _path: str = "") -> dict[str, Any]:
    """Deep-merge ``update`` into a copy of ``base``; unknown keys are an error (catches typos)."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        where = f"{_path}{key}"
        if key not in out:
            raise ConfigError(f"unknown config key: {where}")
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
    try:
        value = yaml_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"cannot parse override value in {text!r}: {exc}") from exc
    nested: dict[str, Any] = {parts[-1]: value}
    for part in reversed(parts[:-1]):
        nested = {part: nested}
    return nested


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> dict[str, Any]:
    """Defaults, merged with the file at ``path`` (YAML or TOML), then with each override."""
    cfg = default_config()
    if path is not None:
        cfg = merge(cfg, _read_file(Path(path)))
    for item in overrides:
        cfg = merge(cfg, parse_override(item))
    return cfg


def save_config(cfg: Mapping[str, Any], path: str | Path) -> Path:
    """Write the resolved config as YAML (what every run keeps beside its results)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(cfg), sort_keys=False))
    return path
