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
  ``(M, C, H, W)`` with ``H == W``, integer labels ``0..K-1`` (:func:`image_data`).
  Subsetting (``data.train_subset``), partitioning, poisoning and canaries are scaleflu's.

Importing a plugin runs its code, as importing any module does: name only modules you trust.
Data files are never executed: :func:`load_npz` reads arrays with ``allow_pickle=False``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import re
import sys
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaleflu.config import ConfigError, is_plugin_file

if TYPE_CHECKING:  # torch and numpy only when a plugin's model or data set is used
    import numpy as np
    from torch import nn

    from scaleflu.fl.data.images import ImageData

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "scaleflu.plugins"
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")

ModelBuilder = Callable[[int, int, int], "nn.Module"]
DatasetLoader = Callable[[Mapping[str, Any], int], tuple[Any, Any]]

_MODELS: dict[str, tuple[ModelBuilder, str]] = {}  # name -> (builder, where it came from)
_DATASETS: dict[str, tuple[DatasetLoader, str]] = {}
_LOADED: dict[str, str] = {}  # plugin spec -> module name
_ENTRY_POINTS_LOADED = False


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
    from scaleflu.config import CHOICES

    _register(_MODELS, "model", name, builder, CHOICES["model.name"])


def register_dataset(name: str, loader: DatasetLoader) -> None:
    """Make ``data.dataset: <name>`` load ``loader(data_cfg, seed) -> (train, test)``."""
    from scaleflu.config import CHOICES

    _register(_DATASETS, "data set", name, loader, CHOICES["data.dataset"])


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
    from importlib.metadata import entry_points

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


def model_names() -> tuple[str, ...]:
    """Names of the registered plugin models."""
    return tuple(_MODELS)


def dataset_names() -> tuple[str, ...]:
    """Names of the registered plugin data sets."""
    return tuple(_DATASETS)


# -- what a plugin gives back, checked --------------------------------------------------------


def build_plugin_model(name: str, num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """Call the registered builder of ``name`` and check that it returned a module that maps
    one image to ``num_classes`` logits."""
    import torch

    builder = model_builder(name)
    if builder is None:
        raise PluginError(f"no model {name!r} is registered")
    where = f"model {name!r} ({_MODELS[name.lower()][1]})"
    try:
        model = builder(num_classes, in_channels, image_size)
    except Exception as exc:  # noqa: BLE001 - the user's builder: one line
        raise PluginError(f"{where} failed to build: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, torch.nn.Module):
        raise PluginError(f"{where} returned {type(model).__name__}, not a torch.nn.Module")
    if not any(True for _ in model.parameters()):
        raise PluginError(f"{where} has no parameters to train")
    try:
        with torch.no_grad():
            was = model.training
            model.eval()
            out = model(torch.zeros(2, in_channels, image_size, image_size))
            model.train(was)
    except Exception as exc:  # noqa: BLE001
        raise PluginError(
            f"{where} cannot take a batch of {in_channels}x{image_size}x{image_size} images: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise PluginError(f"{where} gives {shape} for 2 images; expected (2, {num_classes}) logits")
    return model


def image_data(
    images: Any,
    labels: Any,
    where: str,
    num_classes: int | None = None,
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
    name: str = "",
) -> ImageData:
    """Checked :class:`~scaleflu.fl.data.ImageData` from numpy arrays (``where`` names them in
    errors): ``uint8`` images ``(M, H, W)`` or ``(M, C, H, W)``, square, integer labels in
    ``0..num_classes-1``; ``mean``/``std`` per channel on the 0..1 scale (default: these
    images')."""
    import numpy as np
    import torch

    from scaleflu.fl.data.datasets import DataError
    from scaleflu.fl.data.images import ImageData

    x, y = np.asarray(images), np.asarray(labels)
    if x.dtype != np.uint8:
        raise DataError(f"{where}: images must be uint8 pixels 0..255, got {x.dtype}")
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4 or x.shape[2] != x.shape[3] or x.shape[0] == 0:
        raise DataError(
            f"{where}: images must be (M, H, W) or (M, C, H, W) with H == W and M > 0, got "
            f"{tuple(np.asarray(images).shape)}"
        )
    if y.ndim != 1 or len(y) != len(x) or y.dtype.kind not in "iu":
        raise DataError(
            f"{where}: labels must be integers, one per image ({len(x)}), got {y.dtype} "
            f"{tuple(y.shape)}"
        )
    k = int(y.max()) + 1 if num_classes is None else int(num_classes)
    if int(y.min()) < 0 or int(y.max()) >= k:
        raise DataError(
            f"{where}: labels must be in 0..{k - 1}, got {int(y.min())}..{int(y.max())}"
        )
    if mean is None or std is None:
        f = x.astype(np.float64) / 255.0
        mean = tuple(float(v) for v in f.mean(axis=(0, 2, 3)))
        std = tuple(max(float(v), 1e-3) for v in f.std(axis=(0, 2, 3)))
    return ImageData(
        torch.from_numpy(np.ascontiguousarray(x)),
        torch.from_numpy(y.astype(np.int64)),
        tuple(mean),
        tuple(std),
        k,
        name,
    )


def load_plugin_dataset(name: str, data_cfg: Mapping[str, Any], seed: int) -> tuple[Any, Any]:
    """Call the registered loader of ``name``; (train, test) as checked ImageData sharing the
    training set's class count and normalisation."""
    from scaleflu.fl.data.datasets import DataError
    from scaleflu.fl.data.images import ImageData

    loader = dataset_loader(name)
    if loader is None:
        raise PluginError(f"no data set {name!r} is registered")
    where = f"data set {name!r} ({_DATASETS[name.lower()][1]})"
    try:
        got = loader(data_cfg, seed)
    except (DataError, FileNotFoundError):
        raise
    except Exception as exc:  # noqa: BLE001 - the user's loader: one line
        raise PluginError(f"{where} failed to load: {type(exc).__name__}: {exc}") from None
    if not isinstance(got, tuple | list) or len(got) != 2:
        raise PluginError(f"{where} must return (train, test), got {type(got).__name__}")
    train, test = got
    if not isinstance(train, ImageData):
        if not isinstance(train, tuple | list) or len(train) != 2:
            raise PluginError(f"{where}: train must be ImageData or (images, labels)")
        train = image_data(*train, where=f"{where} train", name=name)
    if not isinstance(test, ImageData):
        if not isinstance(test, tuple | list) or len(test) != 2:
            raise PluginError(f"{where}: test must be ImageData or (images, labels)")
        test = image_data(
            *test, f"{where} test", train.num_classes, train.mean, train.std, name=name
        )
    if (test.in_channels, test.image_size) != (train.in_channels, train.image_size):
        raise DataError(
            f"{where}: train images are {train.in_channels}x{train.image_size}^2, test images "
            f"{test.in_channels}x{test.image_size}^2"
        )
    if test.num_classes != train.num_classes:
        raise DataError(f"{where}: train has {train.num_classes} classes, test {test.num_classes}")
    return train, test


def load_npz(path: str | Path, *keys: str) -> tuple[np.ndarray, ...]:
    """Arrays ``keys`` of an ``.npz`` file, read with ``allow_pickle=False`` (a file that holds
    objects is refused, never executed); a missing key or a bad file names the file."""
    import numpy as np

    from scaleflu.fl.data.datasets import DataError

    path = Path(path)
    try:
        with path.open("rb") as fh:
            if fh.read(4) != b"PK\x03\x04":
                raise DataError(f"{path}: not a readable .npz file (not a zip of .npy arrays)")
        with np.load(path, allow_pickle=False) as z:
            files = list(z.files)
            missing = [k for k in keys if k not in files]
            arrays = tuple(z[k] for k in keys if k in files)
    except FileNotFoundError:
        raise DataError(f"data file not found: {path}") from None
    except DataError:
        raise
    except ValueError as exc:  # object arrays (pickles) are refused here, never loaded
        raise DataError(
            f"{path}: holds Python objects, which are never loaded (save plain arrays): {exc}"
        ) from None
    except (OSError, EOFError, zipfile.BadZipFile, AttributeError, KeyError) as exc:
        raise DataError(f"{path}: not a readable .npz file ({type(exc).__name__}: {exc})") from None
    if missing:
        raise DataError(f"{path}: no array {missing[0]!r} (it holds {', '.join(files) or 'none'})")
    return arrays
