"""Data: strict IDX and CIFAR-100 binary parsing, partitions, poisoning."""

from __future__ import annotations

import gzip
import io
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from fl_helpers import needs_fmnist

from scaleflu.config import ConfigError
from scaleflu.fl.data import (
    DataError,
    ImageData,
    apply_poison,
    load_cifar100,
    load_datasets,
    load_fashion_mnist,
    partition_dirichlet,
    partition_iid,
    read_cifar100_bin,
    read_idx,
    triggered_test_set,
)


def _idx(arr: np.ndarray) -> bytes:
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def _write_fmnist(folder: Path, n_train: int = 20, n_test: int = 10, gz: bool = True) -> None:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        blobs = {
            f"{split}-images-idx3-ubyte": _idx(rng.integers(0, 256, (n, 28, 28))),
            f"{split}-labels-idx1-ubyte": _idx(rng.integers(0, 10, n)),
        }
        for name, blob in blobs.items():
            if gz:
                (folder / f"{name}.gz").write_bytes(gzip.compress(blob))
            else:
                (folder / name).write_bytes(blob)


def test_idx_roundtrip(tmp_path: Path) -> None:
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "a.idx").write_bytes(_idx(arr))
    (tmp_path / "a.idx.gz").write_bytes(gzip.compress(_idx(arr)))
    assert np.array_equal(read_idx(tmp_path / "a.idx"), arr)
    assert np.array_equal(read_idx(tmp_path / "a.idx.gz"), arr)


def test_large_gz_is_kept_unpacked_and_read_from_the_copy(tmp_path: Path, monkeypatch) -> None:
    """A .gz of 1 MiB or more is unpacked once into the cache (SCALEFLU_CACHE) and read from
    there; a copy of the wrong size is ignored and rewritten; a cache that cannot be written is
    skipped; the small files are never copied."""
    from scaleflu.fl.data import datasets

    monkeypatch.setenv("SCALEFLU_CACHE", str(tmp_path / "cache"))
    arr = np.random.default_rng(0).integers(0, 256, (1500, 28, 28)).astype(np.uint8)
    gz = tmp_path / "big-idx3-ubyte.gz"
    gz.write_bytes(gzip.compress(_idx(arr), compresslevel=1))
    assert gz.stat().st_size >= datasets.UNPACK_CACHE_MIN
    assert np.array_equal(read_idx(gz), arr)
    (copy,) = (tmp_path / "cache" / "unpacked").iterdir()
    assert copy.read_bytes() == _idx(arr)

    def no_gzip(*a, **k):
        raise AssertionError("unpacked again although the copy is there")

    with monkeypatch.context() as m:
        m.setattr(datasets.gzip, "open", no_gzip)
        assert np.array_equal(read_idx(gz), arr)
    copy.write_bytes(copy.read_bytes()[:-10])  # a cut copy: unpacked again, copy replaced
    assert np.array_equal(read_idx(gz), arr) and copy.read_bytes() == _idx(arr)

    small = tmp_path / "small.idx.gz"
    small.write_bytes(gzip.compress(_idx(arr[:2])))
    assert np.array_equal(read_idx(small), arr[:2])
    assert len(list((tmp_path / "cache" / "unpacked").iterdir())) == 1

    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("SCALEFLU_CACHE", str(blocked))
    gz.touch()  # a new modification time: a new cache name
    assert np.array_equal(read_idx(gz), arr)


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"\x01\x00\x08\x01" + struct.pack(">I", 2) + b"ab", "bad IDX magic"),
        (b"\x00\x00\x07\x01" + struct.pack(">I", 2) + b"ab", "unknown IDX data type"),
        (b"\x00\x00\x08\x03" + struct.pack(">I", 2), "truncated IDX header"),
        (b"\x00\x00\x08\x01" + struct.pack(">I", 5) + b"abc", "need 5 data bytes, file holds 3"),
        (b"\x00\x00", "too short"),
    ],
)
def test_idx_rejects_corrupt_files(tmp_path: Path, blob: bytes, message: str) -> None:
    path = tmp_path / "bad.idx"
    path.write_bytes(blob)
    with pytest.raises(DataError, match=message):
        read_idx(path)


def test_idx_bad_gzip(tmp_path: Path) -> None:
    path = tmp_path / "bad.idx.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="cannot read"):
        read_idx(path)


def test_fashion_mnist_from_folder(tmp_path: Path) -> None:
    _write_fmnist(tmp_path / "gz")
    train, test = load_fashion_mnist(tmp_path / "gz")
    assert train.pixels.shape == (20, 1, 28, 28) and len(test) == 10
    assert train.inputs().dtype == torch.float32
    _write_fmnist(tmp_path / "raw", gz=False)
    train2, _ = load_fashion_mnist(tmp_path / "raw")
    assert torch.equal(train.pixels, train2.pixels)


def test_fashion_mnist_mismatched_counts(tmp_path: Path) -> None:
    _write_fmnist(tmp_path)
    labels = np.zeros(7, dtype=np.uint8)
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx(labels)))
    with pytest.raises(DataError, match="20 images but 7 labels"):
        load_fashion_mnist(tmp_path)


def test_fashion_mnist_missing_names_files_and_package(tmp_path: Path) -> None:
    _write_fmnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.gz.*dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path)
    with pytest.raises(ConfigError, match="missing"):
        load_datasets({"dataset": "fashion_mnist", "root": str(tmp_path / "none")})


def _cifar_records(n: int, seed: int = 0) -> tuple[bytes, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 20, n).astype(np.uint8)
    fine = rng.integers(0, 100, n).astype(np.uint8)
    pix = rng.integers(0, 256, (n, 3072)).astype(np.uint8)
    rec = np.concatenate([coarse[:, None], fine[:, None], pix], axis=1)
    return rec.tobytes(), fine, pix


def test_cifar100_binary_folder_and_tar(tmp_path: Path) -> None:
    train_b, fine, pix = _cifar_records(6)
    test_b, _, _ = _cifar_records(4, 1)
    folder = tmp_path / "cifar-100-binary"
    folder.mkdir()
    (folder / "train.bin").write_bytes(train_b)
    (folder / "test.bin").write_bytes(test_b)
    train, test = load_cifar100(folder)
    assert train.pixels.shape == (6, 3, 32, 32) and len(test) == 4
    assert train.num_classes == 100 and train.labels.tolist() == fine.tolist()
    assert train.pixels[0].flatten().tolist() == pix[0].tolist()  # channel-major R, G, B planes
    # From the parent folder, and from the archive alone.
    assert len(load_cifar100(tmp_path)[0]) == 6
    arch_dir = tmp_path / "arch"
    arch_dir.mkdir()
    with tarfile.open(arch_dir / "cifar-100-binary.tar.gz", "w:gz") as tar:
        for name, blob in (("train.bin", train_b), ("test.bin", test_b)):
            info = tarfile.TarInfo(f"cifar-100-binary/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    train3, _ = load_cifar100(arch_dir)
    assert torch.equal(train3.pixels, train.pixels)


def test_cifar100_corrupt(tmp_path: Path) -> None:
    blob, _, _ = _cifar_records(2)
    (tmp_path / "short.bin").write_bytes(blob[:-5])
    with pytest.raises(DataError, match="not a positive multiple"):
        read_cifar100_bin(tmp_path / "short.bin")
    bad = bytearray(blob)
    bad[1] = 200
    (tmp_path / "label.bin").write_bytes(bytes(bad))
    with pytest.raises(DataError, match="label out of range"):
        read_cifar100_bin(tmp_path / "label.bin")
    with pytest.raises(DataError, match="cifar-100-binary.tar.gz"):
        load_cifar100(tmp_path / "nothing")


def test_unknown_dataset() -> None:
    with pytest.raises(
        ConfigError,
        match=r"data.dataset must be one of fashion_mnist, cifar100 or a plugin's .*, got 'mnist3'",
    ):
        load_datasets({"dataset": "mnist3"})


@pytest.mark.parametrize("alpha", [0.05, 0.3, 1.0, 100.0])
def test_dirichlet_partition_complete_deterministic(alpha: float) -> None:
    labels = np.random.default_rng(5).integers(0, 10, 3000)
    parts = partition_dirichlet(labels, 100, alpha, seed=7)
    flat = np.concatenate(parts)
    assert len(flat) == 3000 and len(np.unique(flat)) == 3000
    assert min(len(p) for p in parts) >= 1
    again = partition_dirichlet(labels, 100, alpha, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    other = partition_dirichlet(labels, 100, alpha, seed=8)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_dirichlet_min_one_sample_when_scarce() -> None:
    labels = np.zeros(100, dtype=np.int64)
    parts = partition_dirichlet(labels, 100, 0.01, seed=0)
    assert sorted(len(p) for p in parts) == [1] * 100


def test_iid_partition() -> None:
    parts = partition_iid(1003, 10, seed=1)
    flat = np.concatenate(parts)
    assert sorted(flat.tolist()) == list(range(1003))
    assert {len(p) for p in parts} == {100, 101}
    assert all(np.array_equal(a, b) for a, b in zip(parts, partition_iid(1003, 10, 1), strict=True))


def test_partition_errors() -> None:
    with pytest.raises(ConfigError, match="alpha must be > 0"):
        partition_dirichlet(np.zeros(10), 2, 0.0, 0)
    with pytest.raises(ConfigError, match="at least one sample"):
        partition_iid(3, 5, 0)


def _toy(n: int = 200) -> ImageData:
    rng = np.random.default_rng(0)
    return ImageData(
        torch.from_numpy(rng.integers(0, 200, (n, 1, 8, 8)).astype(np.uint8)),
        torch.from_numpy(rng.integers(0, 10, n)),
        (0.5,),
        (0.25,),
        10,
    )


def test_backdoor_and_flips() -> None:
    data = _toy()
    parts = partition_iid(len(data), 4, 0)
    cfg = {
        "backdoor_clients": [1],
        "backdoor_fraction": 0.5,
        "target_label": 3,
        "label_flip_clients": [2],
        "label_flip_fraction": 0.2,
        "label_flip_samples": [int(parts[0][0])],
        "trigger_size": 3,
    }
    poisoned, info = apply_poison(data, parts, cfg, seed=0)
    assert len(info.backdoor_indices) == 25 and set(info.backdoor_indices) <= set(parts[1])
    assert len(info.flipped_indices) == 11  # 10 from client 2, one explicit sample
    b = torch.as_tensor(info.backdoor_indices)
    assert (poisoned.labels[b] == 3).all()
    assert (poisoned.pixels[b][..., -3:, -3:] == 255).all()
    f = torch.as_tensor(info.flipped_indices)
    assert (poisoned.labels[f] != data.labels[f]).all()
    untouched = np.setdiff1d(np.arange(len(data)), np.union1d(info.backdoor_indices, f.numpy()))
    assert torch.equal(poisoned.pixels[untouched], data.pixels[untouched])
    assert torch.equal(poisoned.labels[untouched], data.labels[untouched])
    assert data.pixels.max() < 255  # the clean set is not modified
    _, again = apply_poison(data, parts, cfg, seed=0)
    assert np.array_equal(again.backdoor_indices, info.backdoor_indices)
    assert len(info.client_poisoned(parts[1])) == 25


def test_poison_bad_client() -> None:
    data = _toy(20)
    with pytest.raises(ConfigError, match="outside 0..1"):
        apply_poison(data, partition_iid(20, 2, 0), {"backdoor_clients": [5]}, 0)


def test_triggered_test_set() -> None:
    data = _toy()
    trig = triggered_test_set(data, target_label=3)
    assert len(trig) == int((data.labels != 3).sum())
    assert (trig.labels != 3).all()
    assert (trig.pixels[..., -3:, -3:] == 255).all()


@needs_fmnist
def test_real_fashion_mnist_subset() -> None:
    train, test = load_datasets(
        {"dataset": "fashion_mnist", "train_subset": 500, "test_subset": 100}, seed=3
    )
    assert len(train) == 500 and len(test) == 100 and train.num_classes == 10
    x = train.inputs()
    assert abs(float(x.mean())) < 0.3 and 0.7 < float(x.std()) < 1.3
    again, _ = load_datasets(
        {"dataset": "fashion_mnist", "train_subset": 500, "test_subset": 100}, seed=3
    )
    assert torch.equal(train.labels, again.labels)


def test_download_verifies_checksum(tmp_path: Path) -> None:
    """Download path with a local file:// URL (no network in tests)."""
    import hashlib

    from scaleflu.fl.data import download_file

    src = tmp_path / "src.bin"
    src.write_bytes(b"payload")
    good = hashlib.md5(b"payload").hexdigest()
    out = download_file(src.as_uri(), tmp_path / "dl" / "a.bin", good)
    assert out.read_bytes() == b"payload"
    with pytest.raises(DataError, match="checksum mismatch"):
        download_file(src.as_uri(), tmp_path / "dl" / "b.bin", "0" * 32)
    assert not (tmp_path / "dl" / "b.bin").exists()


def test_grow_clients_gives_the_attacker_its_share() -> None:
    """backdoor_share: client 1 holds 40 % of the data, every sample assigned exactly once."""
    from scaleflu.fl.data import grow_clients, make_partitions

    labels = torch.arange(200) % 10
    cfg = {
        "partition": "dirichlet",
        "alpha": 0.3,
        "num_clients": 5,
        "poison": {"backdoor_clients": [1], "backdoor_share": 0.4},
    }
    parts = make_partitions(cfg, labels, 0)
    assert len(parts[1]) == 80 and all(len(p) >= 1 for p in parts)
    allidx = np.concatenate(parts)
    assert len(allidx) == 200 and len(np.unique(allidx)) == 200
    plain = make_partitions({**cfg, "poison": {"backdoor_clients": [1]}}, labels, 0)
    assert set(plain[1]) <= set(parts[1])  # grown, not replaced
    assert np.array_equal(parts[1], make_partitions(cfg, labels, 0)[1])  # seeded
    for bad in (0.0, 1.0):
        with pytest.raises(ConfigError, match=r"in \(0, 1\)"):
            grow_clients(plain, {1: bad}, 0)
    with pytest.raises(ConfigError, match="sum to less than 1"):
        grow_clients(plain, {1: 0.6, 2: 0.5}, 0)
    with pytest.raises(ConfigError, match="outside"):
        grow_clients(plain, {9: 0.2}, 0)


def test_shift_flips_with_marker_and_poisoned_like() -> None:
    """label_flip_mode shift: y -> y+1 mod C and a top-left marker; held-out images alike."""
    from scaleflu.fl.data import poisoned_like

    data = _toy()
    parts = partition_iid(len(data), 4, 0)
    cfg = {
        "label_flip_clients": [2],
        "label_flip_fraction": 0.5,
        "label_flip_mode": "shift",
        "flip_marker": 2,
        "backdoor_clients": [1],
        "backdoor_fraction": 0.2,
        "target_label": 3,
    }
    poisoned, info = apply_poison(data, parts, cfg, seed=0)
    f = torch.as_tensor(info.flipped_indices)
    assert len(f) == 25 and info.flip_mode == "shift" and info.flip_marker == 2
    assert torch.equal(poisoned.labels[f], (data.labels[f] + 1) % data.num_classes)
    assert (poisoned.pixels[f][..., :2, :2] == 255).all()
    assert info.to_json()["flip_mode"] == "shift"
    held = data.subset(np.arange(5))
    like = poisoned_like(held, info, "label_flip")
    assert torch.equal(like.labels, (held.labels + 1) % data.num_classes)
    assert (like.pixels[..., :2, :2] == 255).all()
    trig = poisoned_like(held, info, "backdoor")
    assert (trig.labels == 3).all() and (trig.pixels[..., -3:, -3:] == 255).all()
    assert torch.equal(poisoned_like(held, info, "clean").pixels, held.pixels)
    with pytest.raises(ConfigError, match="label_flip_mode"):
        apply_poison(data, parts, {**cfg, "label_flip_mode": "rotate"}, 0)
    with pytest.raises(ConfigError, match="fit"):
        apply_poison(data, parts, {**cfg, "flip_marker": 99}, 0)
