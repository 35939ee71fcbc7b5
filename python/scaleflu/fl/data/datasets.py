"""The data sets: FashionMNIST and CIFAR-100 from their official files, checked, cached, subsampled.

Files are read as raw bytes (IDX for FashionMNIST, the *binary* version of CIFAR-100) and parsed
strictly (magic, dimensions, sizes, label ranges: a bad file is a :class:`DataError` naming it);
nothing is unpickled. A download is verified against the official MD5 sum. Parsed files are kept
in memory (one data set at most) so a run, its evaluation and its unlearning in one process
parse them once. :func:`load_datasets` gives the clean (train, test) pair of a ``data`` config
section.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import logging
import os
import tarfile
import urllib.request
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scaleflu import plugins
from scaleflu.config import ConfigError, config_section
from scaleflu.fl.data.images import ImageData

log = logging.getLogger(__name__)

DATASET_NAMES = ("fashion_mnist", "cifar100")
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
CIFAR100_DIR = Path("data/cifar-100-binary")

# Official files and their MD5 sums (Zalando's mirror; Krizhevsky's page).
FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
FASHION_MNIST_FILES = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz"
CIFAR100_MD5 = "03b5dce01913d631647c71ecec9e9cb8"

FASHION_MNIST_MEAN, FASHION_MNIST_STD = (0.2860,), (0.3530,)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)

_IDX_DTYPES = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
CIFAR100_RECORD = 2 + 3072


class DataError(ConfigError):
    """A data file is missing, corrupt or does not match its format."""


# ----------------------------------------------------------------------------- file formats


UNPACK_CACHE_MIN = 1 << 20  # .gz files at least this large are kept unpacked in the user's cache


def unpack_cache_dir() -> Path:
    """Where large .gz data files are kept unpacked: ``$SCALEFLU_CACHE`` or
    ``$XDG_CACHE_HOME/scaleflu`` (``~/.cache/scaleflu``), folder ``unpacked``."""
    base = os.environ.get("SCALEFLU_CACHE")
    if not base:
        base = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scaleflu")
    return Path(base) / "unpacked"


def _unpacked_copy(path: Path) -> Path | None:
    """The cache file of a large .gz (named by its path, size and modification time), or None
    for a small one. Unpacking FashionMNIST's training images takes about 0.3 s, a tenth of a
    short ``scaleflu unlearn`` process; reading the unpacked copy a few milliseconds."""
    st = path.stat()
    if st.st_size < UNPACK_CACHE_MIN:
        return None
    tag = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    return unpack_cache_dir() / f"{path.name.removesuffix('.gz')}-{tag[:16]}"


def _gzip_size(path: Path) -> int:
    """The unpacked size a gzip file declares in its trailer (ISIZE, modulo 2**32)."""
    with open(path, "rb") as fh:
        fh.seek(-4, os.SEEK_END)
        return int.from_bytes(fh.read(4), "little")


def _read_writable(path: Path) -> bytearray:
    """A file's bytes in a buffer an array may keep and write (no copy to make one)."""
    with open(path, "rb") as fh:
        buf = bytearray(os.fstat(fh.fileno()).st_size)
        got = fh.readinto(buf)
        rest = fh.read()  # (a file that grew meanwhile)
    return buf[:got] + rest if got < len(buf) or rest else buf


def _open_maybe_gz(path: Path) -> bytes | bytearray:
    """A file's bytes, unpacked when it is a .gz; a large one from (and into) the unpack
    cache when the cached copy has the size the gzip trailer declares (a cache that cannot be
    written is skipped). Read from a file: a writable buffer."""
    try:
        if path.suffix != ".gz":
            return _read_writable(path)
        copy = _unpacked_copy(path)
        if copy is not None:
            try:
                raw = _read_writable(copy)
                if len(raw) % (1 << 32) == _gzip_size(path):
                    return raw
            except OSError:
                pass  # not cached (yet), or unreadable: unpack it
        with gzip.open(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc
    if copy is not None:
        tmp = copy.with_name(f"{copy.name}.{os.getpid()}.tmp")
        try:
            copy.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(raw)
            os.replace(tmp, copy)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            log.debug("unpack cache not written (%s): %s", copy, exc)
    return raw


def read_idx(path: str | Path) -> np.ndarray:
    """Parse an IDX file (optionally .gz) strictly: magic, dimensions and size must agree."""
    path = Path(path)
    raw = _open_maybe_gz(path)
    if len(raw) < 4:
        raise DataError(f"{path}: too short for an IDX header ({len(raw)} bytes)")
    if raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path}: bad IDX magic {raw[:4].hex()} (first two bytes must be zero)")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise DataError(f"{path}: unknown IDX data type code 0x{code:02x}")
    if ndim < 1:
        raise DataError(f"{path}: IDX file declares zero dimensions")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated IDX header ({len(raw)} < {header} bytes)")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    body = len(raw) - header
    if body != expected:
        raise DataError(f"{path}: IDX dims {dims} need {expected} data bytes, file holds {body}")
    arr = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    if isinstance(raw, bytearray) and dtype.isnative:
        return arr  # a view of a buffer of its own: no copy of FashionMNIST's 47 MB
    return arr.astype(dtype.newbyteorder("="), copy=True)


def _check_idx_pair(images: np.ndarray, labels: np.ndarray, where: str) -> None:
    if images.ndim != 3 or labels.ndim != 1:
        raise DataError(
            f"{where}: expected images (M, H, W) and labels (M,), got {images.shape} and "
            f"{labels.shape}"
        )
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"{where}: {images.shape[0]} images but {labels.shape[0]} labels")
    if images.dtype != np.uint8 or labels.dtype != np.uint8:
        raise DataError(f"{where}: images and labels must be unsigned bytes")
    if labels.size and int(labels.max()) > 9:
        raise DataError(f"{where}: label {int(labels.max())} outside 0..9")


def read_cifar100_bin(path: str | Path, label: str = "fine") -> tuple[np.ndarray, np.ndarray]:
    """Parse a CIFAR-100 binary file: records of coarse byte, fine byte, 3072 pixel bytes."""
    path = Path(path)
    raw = _open_maybe_gz(path)
    if len(raw) == 0 or len(raw) % CIFAR100_RECORD:
        raise DataError(
            f"{path}: size {len(raw)} is not a positive multiple of the CIFAR-100 record "
            f"({CIFAR100_RECORD} bytes)"
        )
    rec = np.frombuffer(raw, dtype=np.uint8).reshape(-1, CIFAR100_RECORD)
    coarse, fine = rec[:, 0], rec[:, 1]
    if coarse.max() > 19 or fine.max() > 99:
        raise DataError(
            f"{path}: label out of range (coarse max {coarse.max()}, fine max {fine.max()}); "
            "is this the CIFAR-100 binary version?"
        )
    images = rec[:, 2:].reshape(-1, 3, 32, 32).copy()
    return images, (fine if label == "fine" else coarse).astype(np.int64)


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download_file(url: str, dest: Path, md5: str) -> Path:
    """Fetch ``url`` to ``dest`` and verify its MD5; a mismatch removes the file and raises."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    log.info("downloading %s -> %s", url, dest)
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, tmp.open("wb") as fh:
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                fh.write(chunk)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise DataError(f"download of {url} failed: {exc}") from exc
    got = _md5(tmp)
    if got != md5:
        tmp.unlink(missing_ok=True)
        raise DataError(f"checksum mismatch for {url}: md5 {got}, expected {md5}")
    tmp.replace(dest)
    return dest


# ----------------------------------------------------------------------------- data sets


# Parsed files, keyed by (path, size, mtime) of every file read: a run, its evaluation and its
# unlearning in one process parse the (gzip) files once. Callers get clones.
_PARSED: dict[tuple[Any, ...], tuple[ImageData, ImageData]] = {}


def _file_key(paths: Sequence[Path]) -> tuple[Any, ...]:
    return tuple((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)


def _cached(key: tuple[Any, ...], pair: tuple[ImageData, ImageData] | None = None) -> Any:
    if pair is not None:
        _PARSED.clear()  # keep one data set in memory at most
        _PARSED[key] = pair
    hit = _PARSED.get(key)
    return None if hit is None else (hit[0].copy(), hit[1].copy())


def load_fashion_mnist(
    root: str | Path | None = None, download: bool = False
) -> tuple[ImageData, ImageData]:
    """FashionMNIST (train, test) from the IDX .gz (or unzipped) files in ``root``."""
    root = Path(root) if root is not None else FASHION_MNIST_DIR

    def find(name: str) -> Path | None:
        for cand in (root / name, root / name.removesuffix(".gz")):
            if cand.is_file():
                return cand
        return None

    missing = [n for n in FASHION_MNIST_FILES if find(n) is None]
    if missing and download:
        for name in missing:
            download_file(FASHION_MNIST_URL + name, root / name, FASHION_MNIST_FILES[name])
        missing = []
    if missing:
        raise DataError(
            f"FashionMNIST files missing in {root}: {', '.join(missing)}. Install the Debian "
            "package dataset-fashion-mnist (files in /usr/share/datasets/fashion-mnist), point "
            "data.root at a folder holding them, or set data.download=true"
        )
    files = {n: find(n) for n in FASHION_MNIST_FILES}
    key = ("fashion_mnist", *_file_key(list(files.values())))  # type: ignore[arg-type]
    hit = _cached(key)
    if hit is not None:
        return hit
    arrays = {n: read_idx(p) for n, p in files.items()}  # type: ignore[arg-type]
    out = []
    for split in ("train", "t10k"):
        images = arrays[f"{split}-images-idx3-ubyte.gz"]
        labels = arrays[f"{split}-labels-idx1-ubyte.gz"]
        _check_idx_pair(images, labels, f"FashionMNIST {split} in {root}")
        out.append(
            ImageData(
                torch.from_numpy(images).unsqueeze(1).contiguous(),
                torch.from_numpy(labels.astype(np.int64)),
                FASHION_MNIST_MEAN,
                FASHION_MNIST_STD,
                10,
                "fashion_mnist",
            )
        )
    return _cached(key, (out[0], out[1]))


def _extract_cifar(archive: Path, dest: Path) -> None:
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar.getmembers():
                base = Path(member.name).name
                if member.isfile() and base in ("train.bin", "test.bin"):
                    fh = tar.extractfile(member)
                    if fh is not None:
                        dest.mkdir(parents=True, exist_ok=True)
                        (dest / base).write_bytes(fh.read())
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DataError(f"cannot extract {archive}: {exc}") from exc


def load_cifar100(
    root: str | Path | None = None, download: bool = False
) -> tuple[ImageData, ImageData]:
    """CIFAR-100 (train, test), fine labels, from ``cifar-100-binary`` or its .tar.gz."""
    root = Path(root) if root is not None else CIFAR100_DIR
    candidates = [root, root / "cifar-100-binary"]
    folder = next((c for c in candidates if (c / "train.bin").is_file()), None)
    if folder is None:
        archives = [
            p
            for p in (root / "cifar-100-binary.tar.gz", root.parent / "cifar-100-binary.tar.gz")
            if p.is_file()
        ]
        if not archives and download:
            archives = [download_file(CIFAR100_URL, root / "cifar-100-binary.tar.gz", CIFAR100_MD5)]
        if archives:
            dest = root / "cifar-100-binary" if root.name != "cifar-100-binary" else root
            _extract_cifar(archives[0], dest)
            folder = dest
    if folder is None or not (folder / "test.bin").is_file():
        raise DataError(
            f"CIFAR-100 binary files missing: need {root}/train.bin and test.bin (or "
            f"{root}/cifar-100-binary.tar.gz from {CIFAR100_URL}); set data.root to their "
            "folder or data.download=true"
        )
    key = ("cifar100", *_file_key([folder / "train.bin", folder / "test.bin"]))
    hit = _cached(key)
    if hit is not None:
        return hit
    out = []
    for split in ("train", "test"):
        images, labels = read_cifar100_bin(folder / f"{split}.bin")
        out.append(
            ImageData(
                torch.from_numpy(images),
                torch.from_numpy(labels),
                CIFAR100_MEAN,
                CIFAR100_STD,
                100,
                "cifar100",
            )
        )
    return _cached(key, (out[0], out[1]))


def _subsample(data: ImageData, size: int | None, seed: int, tag: int) -> ImageData:
    if size is None or size >= len(data):
        return data
    if size < 1:
        raise ConfigError(f"subset size must be >= 1, got {size}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, tag]))
    idx = np.sort(rng.choice(len(data), size=size, replace=False))
    return data.subset(idx)


def load_datasets(data_cfg: Mapping[str, Any], seed: int = 0) -> tuple[ImageData, ImageData]:
    """Clean (train, test) for the ``data`` config section, subsampled when asked."""
    data = config_section("data", data_cfg)  # the checked choice: DATASET_NAMES or a plugin's
    if data.dataset == "fashion_mnist":
        train, test = load_fashion_mnist(data.root, bool(data.download))
    elif data.dataset == "cifar100":
        train, test = load_cifar100(data.root, bool(data.download))
    else:
        train, test = load_plugin_dataset(str(data.dataset), data, seed)
    train = _subsample(train, data.train_subset, seed, 101)
    test = _subsample(test, data.test_subset, seed, 102)
    return train, test


# -- a plugin's data set, checked (scaleflu.plugins) ----------------------------------------


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
    loader = plugins.dataset_loader(name)
    if loader is None:
        raise plugins.PluginError(f"no data set {name!r} is registered")
    where = f"data set {name!r} ({plugins.origin('data set', name)})"
    try:
        got = loader(data_cfg, seed)
    except (DataError, FileNotFoundError):
        raise
    except Exception as exc:  # noqa: BLE001 - the user's loader: one line
        raise plugins.PluginError(f"{where} failed to load: {type(exc).__name__}: {exc}") from None
    if not isinstance(got, tuple | list) or len(got) != 2:
        raise plugins.PluginError(f"{where} must return (train, test), got {type(got).__name__}")
    train, test = got
    if not isinstance(train, ImageData):
        if not isinstance(train, tuple | list) or len(train) != 2:
            raise plugins.PluginError(f"{where}: train must be ImageData or (images, labels)")
        train = image_data(*train, where=f"{where} train", name=name)
    if not isinstance(test, ImageData):
        if not isinstance(test, tuple | list) or len(test) != 2:
            raise plugins.PluginError(f"{where}: test must be ImageData or (images, labels)")
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
