"""Bring your own model and data set: builders and loaders registered by name, from your module.

A plugin is a Python module (an importable name such as ``mypkg.scaleflu_plugin``, or a ``.py``
file) that registers what it brings when it is imported::

    from scaleflu.plugins import register_dataset, register_model

    def build_mynet(num_classes: int, in_channels: int, image_size: int) -> torch.nn.Module: ...
    def load_mydata(data_cfg, seed: int): ...   # -> (train, test)

    register_model("mynet", build_mynet)
    register_dataset("mydata", load_mydata)

A config names its plugins (``plugins: [mypkg.scaleflu_plugin]``, or ``--plugin`` on the
command line) and then uses the names like the built-in ones (``model.name: mynet``,
``data.dataset: mydata``). The plugins are imported when the config is checked, so every
consumer of that config -- ``scaleflu train``, ``unlearn`` (the run's saved config names them),
``experiment``, the testbed's server and every robot -- loads the same plugins. Installed
packages may also offer plugins under the entry-point group ``scaleflu.plugins`` (a module, or
a function called once); those are loaded the first time a name is not found.

The contracts:

* a model builder takes ``(num_classes, in_channels, image_size)`` and returns a
  ``torch.nn.Module`` mapping ``(B, in_channels, image_size, image_size)`` images to
  ``(B, num_classes)`` logits; SCALE's layers are its Conv/Linear weights.
* a data set loader takes ``(data_cfg, seed)`` (the checked ``data`` config section: ``root``
  is yours to use) and returns ``(train, test)``, each an :class:`~scaleflu.fl.data.ImageData`
  or a pair ``(images, labels)`` of numpy arrays: ``uint8`` images ``(M, H, W)`` or
  ``(M, C, H, W)`` with ``H == W``, integer labels ``0..K-1``
  (:func:`scaleflu.fl.data.image_data`).
  Subsetting (``data.train_subset``), partitioning, poisoning and canaries are scaleflu's.

Importing a plugin runs its code, as importing any module does: name only modules you trust.
Data files are never executed: :func:`scaleflu.fl.data.load_npz` reads arrays with
``allow_pickle=False``. This module is the registry alone (it imports nothing else of
scaleflu); the checks of what a builder or loader returns are
:func:`scaleflu.fl.models.build_plugin_model` and :func:`scaleflu.fl.data.load_plugin_dataset`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaleflu.errors import ConfigError

if TYPE_CHECKING:  # torch and numpy only when a plugin's model or data set is used
    from torch import nn


log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "scaleflu.plugins"
# the built-in names (scaleflu.fl.models.MODEL_NAMES, scaleflu.fl.data.DATASET_NAMES): the
# config's choices, which a plugin adds to and may not take
BUILTIN_MODELS = ("lenet", "mobilenetv3", "resnet18")
BUILTIN_DATASETS = ("fashion_mnist", "cifar100")
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")

ModelBuilder = Callable[[int, int, int], "nn.Module"]
DatasetLoader = Callable[[Mapping[str, Any], int], tuple[Any, Any]]

_MODELS: dict[str, tuple[ModelBuilder, str]] = {}  # name -> (builder, where it came from)
_DATASETS: dict[str, tuple[DatasetLoader, str]] = {}
_LOADED: dict[str, str] = {}  # plugin spec -> module name
_ENTRY_POINTS_LOADED = False


def is_plugin_file(spec: Any) -> bool:
    """Whether a plugin spec names a file (``*.py`` or a path) rather than a module."""
    return isinstance(spec, str) and (spec.endswith(".py") or "/" in spec or "\\" in spec)


class PluginError(ConfigError):
    """A plugin cannot be loaded, or what it registered breaks its contract."""


def _origin(func: Callable[..., Any]) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', func)}"


def _register(table: dict[str, Any], kind: str, name: str, func: Any, builtin: tuple[str, ...]):
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise PluginError(
            f"{kind} name {name!r}: use letters, digits, '_', '.', '-', starting with a letter"
        )
    if not callable(func):
        raise PluginError(f"{kind} {name!r}: {func!r} is not callable")
    key = name.lower()
    if key in builtin:
        raise PluginError(f"{kind} {name!r} is built in; register yours under another name")
    old = table.get(key)
    if old is not None and old[0] is not func and old[1] != _origin(func):
        raise PluginError(f"{kind} {name!r} is registered twice ({old[1]} and {_origin(func)})")
    table[key] = (func, _origin(func))


def register_model(name: str, builder: ModelBuilder) -> None:
    """Make ``model.name: <name>`` build ``builder(num_classes, in_channels, image_size)``."""
    _register(_MODELS, "model", name, builder, BUILTIN_MODELS)


def register_dataset(name: str, loader: DatasetLoader) -> None:
    """Make ``data.dataset: <name>`` load ``loader(data_cfg, seed) -> (train, test)``."""
    _register(_DATASETS, "data set", name, loader, BUILTIN_DATASETS)


def _import_file(path: Path) -> str:
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    name = f"scaleflu_plugin_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}_{digest}"
    if name in sys.modules:
        return name
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin {path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return name


def load_plugin(spec: str) -> str:
    """Import one plugin (a module name or a ``.py`` file) once; returns its module name.

    Any failure -- missing, a syntax error, an exception while it registers -- is one
    :class:`PluginError` line naming the plugin.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"plugin must be a module name or a .py file, got {spec!r}")
    spec = spec.strip()
    if spec in _LOADED:
        return _LOADED[spec]
    try:
        if is_plugin_file(spec):
            path = Path(spec).expanduser()
            if not path.is_file():
                raise PluginError(f"plugin file not found: {path}")
            name = _import_file(path.resolve())
        else:
            importlib.import_module(spec)
            name = spec
    except PluginError:
        raise
    except ModuleNotFoundError as exc:
        if exc.name is not None and spec.startswith(exc.name):
            raise PluginError(
                f"plugin {spec!r} not found (no module named {exc.name!r}): install its package, "
                "add its folder to PYTHONPATH, or name its .py file"
            ) from None
        raise PluginError(f"plugin {spec!r} failed to import: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module: any error, one line
        raise PluginError(
            f"plugin {spec!r} failed to import: {type(exc).__name__}: {exc}"
        ) from None
    _LOADED[spec] = name
    log.debug("plugin %s loaded (%s)", spec, name)
    return name


def load_plugins(specs: Iterable[str] | None) -> None:
    """Import every plugin of a config's ``plugins`` list (or ``--plugin`` values)."""
    if specs is None:
        return
    if isinstance(specs, str) or not isinstance(specs, Iterable):
        raise PluginError(f"plugins must be a list of module names or .py files, got {specs!r}")
    for spec in specs:
        load_plugin(spec)


def _entry_points() -> None:
    """Load the installed packages' plugins (entry-point group ``scaleflu.plugins``) once."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, type(sys)):
                obj()
        except Exception as exc:  # noqa: BLE001 - an installed package's plugin: one line
            raise PluginError(
                f"plugin entry point {ep.name!r} ({ep.value}) failed: {type(exc).__name__}: {exc}"
            ) from None


def model_builder(name: str) -> ModelBuilder | None:
    """The registered builder of ``name`` (None: none; installed plugins are looked at once)."""
    key = str(name).lower()
    if key not in _MODELS:
        _entry_points()
    hit = _MODELS.get(key)
    return None if hit is None else hit[0]


def dataset_loader(name: str) -> DatasetLoader | None:
    """The registered loader of ``name`` (None: none; installed plugins are looked at once)."""
    key = str(name).lower()
    if key not in _DATASETS:
        _entry_points()
    hit = _DATASETS.get(key)
    return None if hit is None else hit[0]


def origin(kind: str, name: str) -> str:
    """Where the registered ``kind`` ("model" or "data set") ``name`` came from (its function)."""
    table = _MODELS if kind == "model" else _DATASETS
    hit = table.get(str(name).lower())
    return "?" if hit is None else hit[1]


def model_names() -> tuple[str, ...]:
    """Names of the registered plugin models."""
    return tuple(_MODELS)


def dataset_names() -> tuple[str, ...]:
    """Names of the registered plugin data sets."""
    return tuple(_DATASETS)
