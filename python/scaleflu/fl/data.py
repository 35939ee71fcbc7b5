"""Data sets (FashionMNIST, CIFAR-100), client partitions and the poisoned evaluation variants.

Images are held in memory as raw ``uint8`` tensors ``(M, C, H, W)`` and normalised per batch
(:meth:`ImageData.inputs`), so a trigger patch is written on the pixel scale and CIFAR-100
needs 150 MB rather than 600 MB. Files are read as raw bytes (IDX for FashionMNIST, the
*binary* version of CIFAR-100); nothing is unpickled.

Partitions (:func:`partition_iid`, :func:`partition_dirichlet`) are deterministic functions of
the seed. Dirichlet: for every class, proportions ``p ~ Dir(alpha * 1_N)`` split that class's
shuffled samples among the N clients. A client left with no sample then takes one sample from
the currently largest client (lowest index on ties), repeatedly, so every client holds at
least one sample and every sample is assigned exactly once.

Poisoning (GUIDE 3.6): :func:`apply_poison` puts a white ``trigger_size`` square in the
bottom-right corner and the target label on a fraction of each backdoor client's samples, and
flips labels (to a seeded random *other* class) on a fraction of each label-flip client's
samples or on given sample indices. :func:`triggered_test_set` gives the triggered test images
whose true label differs from the target, for the attack success rate.

The evaluation protocol with power (docs/reproducing.md) adds: ``backdoor_share`` /
``label_flip_share`` (:func:`grow_clients`: the listed clients hold that fraction of the training
set, taken at random from the other clients, so the attacker's contribution outlasts its
departure), ``label_flip_mode: shift`` (y -> y+1 mod C for every flipped sample, a coherent
all-to-all mapping a model can learn, where ``random`` flips are label noise) and
``flip_marker`` (a white square of that side in the *top-left* corner of every flipped sample:
with ``shift`` the flipped set is a learnable all-to-all backdoor, BadNets' all-to-all attack).
:func:`poisoned_like` applies the same transformation to held-out images (class-matched
non-members for the membership audit).
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import tarfile
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scaleflu.config import ConfigError, config_section

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


@dataclass
class ImageData:
    """Images as raw ``uint8`` ``(M, C, H, W)`` with int64 labels; normalised on access."""

    pixels: torch.Tensor
    labels: torch.Tensor
    mean: tuple[float, ...]
    std: tuple[float, ...]
    num_classes: int
    name: str = ""
    _mean_t: torch.Tensor = field(init=False, repr=False)
    _std_t: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.pixels.dtype != torch.uint8 or self.pixels.dim() != 4:
            raise ValueError("pixels must be a uint8 tensor of shape (M, C, H, W)")
        if self.labels.shape != (self.pixels.shape[0],):
            raise ValueError("labels must have one entry per image")
        self.labels = self.labels.to(torch.int64)
        c = self.pixels.shape[1]
        dev = self.pixels.device
        self._mean_t = torch.tensor(self.mean, dtype=torch.float32, device=dev).view(1, c, 1, 1)
        self._std_t = torch.tensor(self.std, dtype=torch.float32, device=dev).view(1, c, 1, 1)
        self._mean_t, self._std_t = self._mean_t * 255.0, self._std_t * 255.0

    def __len__(self) -> int:
        return int(self.pixels.shape[0])

    @property
    def in_channels(self) -> int:
        """Number of image channels."""
        return int(self.pixels.shape[1])

    @property
    def image_size(self) -> int:
        """Side of the (square) images."""
        return int(self.pixels.shape[2])

    def inputs(self, idx: torch.Tensor | np.ndarray | slice | None = None) -> torch.Tensor:
        """Normalised float32 images at ``idx`` (all when None), on the data's device."""
        if isinstance(idx, torch.Tensor) and idx.device != self.pixels.device:
            idx = idx.to(self.pixels.device)
        px = self.pixels if idx is None else self.pixels[idx]
        return (px.to(torch.float32) - self._mean_t) / self._std_t

    @property
    def device(self) -> torch.device:
        """Where the pixels and labels are held."""
        return self.pixels.device

    def to(self, device: torch.device | str) -> ImageData:
        """The same data set on ``device`` (``self`` when it is already there)."""
        device = torch.device(device)
        if self.pixels.device == device:
            return self
        out = ImageData(
            self.pixels.to(device),
            self.labels.to(device),
            self.mean,
            self.std,
            self.num_classes,
            self.name,
        )
        return out

    def subset(self, idx: torch.Tensor | np.ndarray) -> ImageData:
        """A new data set holding the samples at ``idx`` (copies)."""
        idx_t = torch.as_tensor(np.asarray(idx), dtype=torch.int64)
        return ImageData(
            self.pixels[idx_t].clone(),
            self.labels[idx_t].clone(),
            self.mean,
            self.std,
            self.num_classes,
            self.name,
        )

    def copy(self) -> ImageData:
        """A deep copy (poisoning works on copies)."""
        return ImageData(
            self.pixels.clone(),
            self.labels.clone(),
            self.mean,
            self.std,
            self.num_classes,
            self.name,
        )


# ----------------------------------------------------------------------------- file formats


def _open_maybe_gz(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        return path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc


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
    data = config_section("data", data_cfg)  # the checked choice: one of DATASET_NAMES
    if data.dataset == "fashion_mnist":
        train, test = load_fashion_mnist(data.root, bool(data.download))
    else:
        train, test = load_cifar100(data.root, bool(data.download))
    train = _subsample(train, data.train_subset, seed, 101)
    test = _subsample(test, data.test_subset, seed, 102)
    return train, test


# ----------------------------------------------------------------------------- partitions


def partition_iid(num_samples: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """Shuffle and split into ``num_clients`` parts of sizes differing by at most one."""
    if num_clients < 1 or num_samples < num_clients:
        raise ConfigError(
            f"cannot give {num_clients} clients at least one sample each from {num_samples}"
        )
    rng = np.random.default_rng(np.random.SeedSequence([seed, 11]))
    perm = rng.permutation(num_samples)
    return [np.sort(p) for p in np.array_split(perm, num_clients)]


def partition_dirichlet(
    labels: np.ndarray | torch.Tensor, num_clients: int, alpha: float, seed: int
) -> list[np.ndarray]:
    """Label-skewed split: per class, Dir(alpha) proportions over clients; >=1 sample each."""
    labels = np.asarray(labels)
    if alpha <= 0:
        raise ConfigError(f"Dirichlet alpha must be > 0, got {alpha}")
    if num_clients < 1 or len(labels) < num_clients:
        raise ConfigError(
            f"cannot give {num_clients} clients at least one sample each from {len(labels)}"
        )
    rng = np.random.default_rng(np.random.SeedSequence([seed, 12]))
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        props = rng.dirichlet(np.full(num_clients, float(alpha)))
        cuts = (np.cumsum(props)[:-1] * len(idx)).astype(np.int64)
        for n, chunk in enumerate(np.split(idx, cuts)):
            parts[n].extend(chunk.tolist())
    # Every client gets >= 1 sample: an empty client takes one from the currently largest.
    for n in range(num_clients):
        if not parts[n]:
            donor = max(range(num_clients), key=lambda k: (len(parts[k]), -k))
            parts[n].append(parts[donor].pop())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def make_partitions(
    data_cfg: Mapping[str, Any], labels: torch.Tensor, seed: int
) -> list[np.ndarray]:
    """Partitions of the training set for the ``data`` config section.

    ``data.poison.backdoor_share`` / ``label_flip_share`` then grow the listed clients
    (:func:`grow_clients`).
    """
    data = config_section("data", data_cfg)  # partition: the checked choice iid | dirichlet
    n = int(data.num_clients)
    if data.partition == "iid":
        parts = partition_iid(len(labels), n, seed)
    else:
        parts = partition_dirichlet(labels.numpy(), n, float(data.alpha), seed)
    poison = data.poison
    shares: dict[int, float] = {}
    for clients_key, share_key in (
        ("backdoor_clients", "backdoor_share"),
        ("label_flip_clients", "label_flip_share"),
    ):
        share = poison[share_key]
        if share is None:
            continue
        for c in poison[clients_key]:
            shares[int(c)] = float(share)
    return grow_clients(parts, shares, seed) if shares else parts


def grow_clients(
    parts: Sequence[np.ndarray], shares: Mapping[int, float], seed: int
) -> list[np.ndarray]:
    """Give each client ``c`` in ``shares`` ``round(share * total)`` samples (never fewer).

    The extra samples are drawn uniformly at random (seeded) from the clients not in
    ``shares``; every client keeps at least one sample and every sample stays assigned once.
    """
    parts = [np.asarray(p, dtype=np.int64) for p in parts]
    n = len(parts)
    total = sum(len(p) for p in parts)
    bad = [c for c in shares if not 0 <= int(c) < n]
    if bad:
        raise ConfigError(f"data.poison share for clients {bad} outside 0..{n - 1}")
    for c, sh in shares.items():
        if not 0.0 < float(sh) < 1.0:
            raise ConfigError(f"data.poison share of client {c} must be in (0, 1), got {sh}")
    if sum(float(v) for v in shares.values()) >= 1.0:
        raise ConfigError("data.poison shares of the grown clients must sum to less than 1")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 13]))
    donors = [k for k in range(n) if k not in shares]
    if not donors:
        raise ConfigError("data.poison shares leave no other client to take samples from")
    # the donors' samples, minus one kept by each donor, in a seeded random order
    pool = rng.permutation(np.concatenate([parts[k][1:] for k in donors]))
    taken: set[int] = set()
    pos = 0
    for c in sorted(int(k) for k in shares):
        want = int(round(float(shares[c]) * total)) - len(parts[c])
        if want <= 0:
            continue
        if pos + want > len(pool):
            raise ConfigError(f"data.poison share of client {c} needs more samples than exist")
        extra = pool[pos : pos + want]
        pos += want
        taken.update(int(i) for i in extra)
        parts[c] = np.sort(np.concatenate([parts[c], extra]))
    if taken:
        gone = np.fromiter(taken, dtype=np.int64)
        for k in donors:
            parts[k] = np.setdiff1d(parts[k], gone)
    return parts


# ----------------------------------------------------------------------------- poisoning


def add_trigger(pixels: torch.Tensor, size: int = 3) -> torch.Tensor:
    """Copy of uint8 images ``(..., C, H, W)`` with a white ``size``x``size`` bottom-right patch."""
    out = pixels.clone()
    out[..., -size:, -size:] = 255
    return out


def add_marker(pixels: torch.Tensor, size: int) -> torch.Tensor:
    """Copy of uint8 images with a white ``size``x``size`` *top-left* patch (flipped samples)."""
    out = pixels.clone()
    if size > 0:
        out[..., :size, :size] = 255
    return out


FLIP_MODES = ("random", "shift")


@dataclass
class PoisonInfo:
    """Which training samples (global indices) were triggered or relabelled, and how."""

    backdoor_indices: np.ndarray
    flipped_indices: np.ndarray
    target_label: int
    trigger_size: int
    original_labels: dict[int, int]
    flip_mode: str = "random"
    flip_marker: int = 0
    # membership canaries (:func:`insert_canaries`): row i of ``canary_copies`` holds the
    # training indices of canary i's copies (column 0 its original sample), ``canary_heldout[i]``
    # the index of its class-matched held-out twin (relabelled alike, in no partition)
    canary_copies: np.ndarray = field(default_factory=lambda: np.empty((0, 1), np.int64))
    canary_heldout: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    @property
    def canary_members(self) -> np.ndarray:
        """The canaries' original training indices (one per canary, in canary order)."""
        return self.canary_copies[:, 0] if len(self.canary_copies) else np.empty(0, np.int64)

    @property
    def canary_indices(self) -> np.ndarray:
        """Every training index holding a canary copy, sorted."""
        return np.sort(self.canary_copies.ravel())

    def client_poisoned(self, part: np.ndarray) -> np.ndarray:
        """The poisoned (triggered, flipped or canary) indices inside one client's partition."""
        bad = np.union1d(
            np.union1d(self.backdoor_indices, self.flipped_indices), self.canary_indices
        )
        return np.intersect1d(part, bad)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {
            "backdoor_indices": self.backdoor_indices.tolist(),
            "flipped_indices": self.flipped_indices.tolist(),
            "target_label": self.target_label,
            "trigger_size": self.trigger_size,
            "flip_mode": self.flip_mode,
            "flip_marker": self.flip_marker,
            "canary_copies": self.canary_copies.tolist(),
            "canary_heldout": self.canary_heldout.tolist(),
        }


def _pick(rng: np.random.Generator, part: np.ndarray, fraction: float) -> np.ndarray:
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"poison fraction must be in [0, 1], got {fraction}")
    k = int(round(fraction * len(part)))
    return np.sort(rng.choice(part, size=k, replace=False)) if k else np.empty(0, np.int64)


def flip_labels(
    labels: torch.Tensor, indices: np.ndarray, num_classes: int, seed: int, mode: str = "random"
) -> torch.Tensor:
    """Copy of ``labels`` where each sample at ``indices`` gets another class.

    ``random``: a seeded random other class; ``shift``: y + 1 mod C (one coherent mapping).
    """
    if mode not in FLIP_MODES:
        raise ConfigError(f"data.poison.label_flip_mode must be one of {FLIP_MODES}, got {mode!r}")
    out = labels.clone()
    if len(indices) == 0:
        return out
    if mode == "shift":
        shift = np.ones(len(indices), dtype=np.int64)
    else:
        rng = np.random.default_rng(np.random.SeedSequence([seed, 22]))
        shift = rng.integers(1, num_classes, size=len(indices))
    idx = torch.as_tensor(indices, dtype=torch.int64)
    out[idx] = (labels[idx] + torch.as_tensor(shift)) % num_classes
    return out


def apply_poison(
    train: ImageData,
    parts: Sequence[np.ndarray],
    poison_cfg: Mapping[str, Any] | None,
    seed: int,
) -> tuple[ImageData, PoisonInfo]:
    """Poisoned copy of ``train`` (backdoor and label flips per ``data.poison``) and its record."""
    cfg = config_section("data.poison", poison_cfg)
    target = int(cfg.target_label)
    size = int(cfg.trigger_size)
    mode = str(cfg.label_flip_mode)
    marker = int(cfg.flip_marker)
    if mode not in FLIP_MODES:
        raise ConfigError(f"data.poison.label_flip_mode must be one of {FLIP_MODES}, got {mode!r}")
    side = train.image_size
    if not 1 <= size <= side or not 0 <= marker <= side:
        raise ConfigError(f"data.poison trigger_size / flip_marker must fit a {side}-pixel image")
    n_clients = len(parts)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 21]))
    if not 0 <= target < train.num_classes:
        raise ConfigError(f"data.poison.target_label {target} outside 0..{train.num_classes - 1}")

    def clients(key: str) -> list[int]:
        vals = [int(c) for c in cfg[key]]
        bad = [c for c in vals if not 0 <= c < n_clients]
        if bad:
            raise ConfigError(f"data.poison.{key} has clients {bad} outside 0..{n_clients - 1}")
        return vals

    back = [_pick(rng, parts[c], float(cfg.backdoor_fraction)) for c in clients("backdoor_clients")]
    flip = [
        _pick(rng, parts[c], float(cfg.label_flip_fraction)) for c in clients("label_flip_clients")
    ]
    extra = np.asarray(cfg.label_flip_samples, dtype=np.int64)
    if extra.size and (extra.min() < 0 or extra.max() >= len(train)):
        raise ConfigError("data.poison.label_flip_samples holds indices outside the training set")
    back_idx = np.unique(np.concatenate(back)) if back else np.empty(0, np.int64)
    flip_idx = (
        np.unique(np.concatenate([*flip, extra])) if (flip or extra.size) else np.empty(0, np.int64)
    )
    flip_idx = np.setdiff1d(flip_idx, back_idx)  # a triggered sample keeps the target label
    if back_idx.size == 0 and flip_idx.size == 0:
        return train, PoisonInfo(back_idx, flip_idx, target, size, {}, mode, marker)
    out = train.copy()
    original = {int(i): int(train.labels[i]) for i in np.concatenate([back_idx, flip_idx])}
    if back_idx.size:
        ti = torch.as_tensor(back_idx)
        out.pixels[ti] = add_trigger(out.pixels[ti], size)
        out.labels[ti] = target
    if flip_idx.size:
        out.labels = flip_labels(out.labels, flip_idx, train.num_classes, seed, mode)
        if marker:
            fi = torch.as_tensor(flip_idx)
            out.pixels[fi] = add_marker(out.pixels[fi], marker)
    log.info("poisoned %d backdoor and %d label-flipped samples", back_idx.size, flip_idx.size)
    return out, PoisonInfo(back_idx, flip_idx, target, size, original, mode, marker)


def insert_canaries(
    clean: ImageData,
    train: ImageData,
    parts: Sequence[np.ndarray],
    poison_cfg: Mapping[str, Any] | None,
    poison: PoisonInfo,
    seed: int,
) -> tuple[ImageData, ImageData, list[np.ndarray], PoisonInfo]:
    """Membership canaries (``data.poison.canaries``): memorised samples with held-out twins.

    For each client in ``canary_clients``: ``canaries`` pairs of its clean (not triggered, not
    flipped) samples *of the same true class* are drawn (seeded). One of each pair becomes a
    canary: a uniformly random wrong label, held ``canary_copies`` times by the client (copies
    appended to the training set, so the model memorises it, as in Carlini et al.'s Secret
    Sharer and the mislabelled canaries of Steinke et al. 2023); the other gets *the same*
    wrong label and leaves the client's partition: trained on by nobody, it is the canary's
    matched non-member (same true class, same label: a model that saw neither scores the two
    alike, so the audit's null is tight). Returns (clean, train, parts, poison) extended;
    ``canaries: 0`` returns the inputs unchanged (bit-exact runs without canaries).
    """
    cfg = config_section("data.poison", poison_cfg)
    k = int(cfg.canaries)
    copies = int(cfg.canary_copies)
    who = [int(c) for c in cfg.canary_clients]
    if k < 0 or copies < 1:
        raise ConfigError("data.poison.canaries must be >= 0 and canary_copies >= 1")
    if k == 0 or not who:
        return clean, train, list(parts), poison
    n_clients = len(parts)
    bad = [c for c in who if not 0 <= c < n_clients]
    if bad or len(set(who)) != len(who):
        raise ConfigError(
            f"data.poison.canary_clients {who} must be distinct clients in 0..{n_clients - 1}"
        )
    used = np.union1d(poison.backdoor_indices, poison.flipped_indices)
    true = clean.labels.numpy()
    C = train.num_classes
    members: list[int] = []
    held: list[int] = []
    for c in who:
        rng = np.random.default_rng(np.random.SeedSequence([seed, 23, c]))
        cand = rng.permutation(np.setdiff1d(np.asarray(parts[c], np.int64), used))
        pending: dict[int, int] = {}
        got = 0
        for i in cand:  # pair each sample with the next unpaired one of its class
            y = int(true[i])
            if y in pending:
                members.append(pending.pop(y))
                held.append(int(i))
                got += 1
                if got == k:
                    break
            else:
                pending[y] = int(i)
        if got < k:
            raise ConfigError(
                f"data.poison.canaries: client {c} has only {got} same-class pairs of clean "
                f"samples, {k} asked"
            )
    m_idx = np.asarray(members, np.int64)
    h_idx = np.asarray(held, np.int64)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 24]))
    both = np.concatenate([m_idx, h_idx])
    shift = torch.as_tensor(rng.integers(1, C, size=len(both))[: len(m_idx)])
    train = train.copy()
    mt, ht = torch.as_tensor(m_idx), torch.as_tensor(h_idx)
    train.labels[mt] = (clean.labels[mt] + shift) % C
    train.labels[ht] = train.labels[mt]  # the twin: same true class, same wrong label
    # the copies: appended to both sets (clean keeps the true label)
    M = len(train)
    extra = np.repeat(m_idx, copies - 1)
    et = torch.as_tensor(extra)
    new_idx = np.arange(M, M + len(extra), dtype=np.int64).reshape(len(m_idx), copies - 1)
    if len(extra):
        train.pixels = torch.cat([train.pixels, train.pixels[et]])
        train.labels = torch.cat([train.labels, train.labels[et]])
        clean = clean.copy()
        clean.pixels = torch.cat([clean.pixels, clean.pixels[et]])
        clean.labels = torch.cat([clean.labels, clean.labels[et]])
    table = np.concatenate([m_idx[:, None], new_idx], axis=1)
    out_parts = [np.asarray(p, np.int64) for p in parts]
    for j, c in enumerate(who):
        rows = slice(j * k, (j + 1) * k)
        out_parts[c] = np.sort(
            np.concatenate([np.setdiff1d(out_parts[c], h_idx[rows]), table[rows, 1:].ravel()])
        )
    poison = PoisonInfo(
        poison.backdoor_indices,
        poison.flipped_indices,
        poison.target_label,
        poison.trigger_size,
        {**poison.original_labels, **{int(i): int(true[i]) for i in both}},
        poison.flip_mode,
        poison.flip_marker,
        table,
        h_idx,
    )
    log.info("%d canaries x %d copies on clients %s", len(m_idx), copies, who)
    return clean, train, out_parts, poison


def poisoned_like(data: ImageData, poison: PoisonInfo, kind: str, seed: int = 0) -> ImageData:
    """Held-out images transformed as the protocol transformed training samples of ``kind``.

    ``backdoor``: trigger and target label; ``label_flip``: the flip marker and the flipped
    label (``shift``: y+1 mod C; ``random``: a seeded random other class); anything else: a
    copy. Class-matched non-members of a poisoned forget set are built with this.
    """
    out = data.copy()
    if kind == "backdoor":
        out.pixels = add_trigger(out.pixels, poison.trigger_size)
        out.labels = torch.full_like(out.labels, poison.target_label)
    elif kind == "label_flip":
        idx = np.arange(len(out))
        out.labels = flip_labels(out.labels, idx, out.num_classes, seed + 1, poison.flip_mode)
        out.pixels = add_marker(out.pixels, poison.flip_marker)
    return out


def triggered_test_set(test: ImageData, target_label: int, trigger_size: int = 3) -> ImageData:
    """Triggered test images whose true label is not the target (attack success rate set)."""
    keep = torch.nonzero(test.labels != target_label).flatten()
    sub = test.subset(keep.numpy())
    sub.pixels = add_trigger(sub.pixels, trigger_size)
    return sub
