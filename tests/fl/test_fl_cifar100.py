"""CIFAR-100 in the official binary format: a one-command run, local files first, checksums.

The real data cannot be had on our machines; the test writes a small ``train.bin`` /
``test.bin`` in the official layout (1 coarse label byte, 1 fine label byte, 3072 pixel bytes
-- R, G, B planes of 32x32 -- per record) and runs ``scaleflu train`` on it.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from scaleflu.fl.data import CIFAR100_RECORD, DataError, download_file, load_cifar100
from scaleflu.fl.data import datasets as data_mod


def _write_cifar(folder: Path, n_train: int = 60, n_test: int = 30) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, n in (("train.bin", n_train), ("test.bin", n_test)):
        rec = np.empty((n, CIFAR100_RECORD), np.uint8)
        rec[:, 0] = rng.integers(0, 20, n)  # coarse label
        rec[:, 1] = np.arange(n) % 100  # fine label
        rec[:, 2:] = rng.integers(0, 256, (n, 3072))
        (folder / name).write_bytes(rec.tobytes())


def test_one_command_run_on_cifar100(tmp_path: Path) -> None:
    """`scaleflu train --set data.dataset=cifar100 --set data.root=DIR` trains and evaluates."""
    from scaleflu.cli import main

    root = tmp_path / "data"
    _write_cifar(root / "cifar-100-binary")
    out = tmp_path / "run"
    sets = [
        "data.dataset=cifar100",
        f"data.root={root}",
        "data.num_clients=3",
        "data.partition=iid",
        "data.poison.backdoor_clients=[0]",
        "data.poison.label_flip_clients=[]",
        "model.name=lenet",
        "fl.rounds=1",
        "fl.local_epochs=1",
        "fl.batch_size=20",
        "fl.clients_per_round=3",
        "fl.device=cpu",
    ]
    argv = ["train", "--out", str(out), "--no-progress"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0
    assert (out / "model.safetensors").is_file()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["round"] == 1 and 0.0 <= rows[-1]["test_acc"] <= 1.0
    assert "asr" in rows[-1]  # the 3-channel trigger was applied and measured


def test_local_files_come_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With data.download=true, present files are used and nothing is fetched."""

    def no_download(*_a: object, **_k: object) -> Path:
        raise AssertionError("downloaded although the files are there")

    monkeypatch.setattr(data_mod, "download_file", no_download)
    _write_cifar(tmp_path / "cifar-100-binary", 10, 5)
    train, test = load_cifar100(tmp_path, download=True)
    assert len(train) == 10 and len(test) == 5 and train.pixels.shape[1:] == (3, 32, 32)


def test_download_is_checksum_verified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The archive is accepted only with the expected MD5; a mismatch leaves nothing behind."""
    src = tmp_path / "src"
    _write_cifar(src / "cifar-100-binary", 8, 4)
    archive = tmp_path / "srv" / "cifar-100-binary.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / "cifar-100-binary", arcname="cifar-100-binary")
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    url = archive.as_uri()
    bad = tmp_path / "bad" / "x.tar.gz"
    with pytest.raises(DataError, match="checksum mismatch"):
        download_file(url, bad, "0" * 32)
    assert not bad.exists() and not bad.with_suffix(".gz.part").exists()
    # load_cifar100 with no local files fetches the official URL: point it at our archive
    monkeypatch.setattr(data_mod, "CIFAR100_URL", url)
    monkeypatch.setattr(data_mod, "CIFAR100_MD5", md5)
    root = tmp_path / "fresh"
    train, test = load_cifar100(root, download=True)
    assert len(train) == 8 and len(test) == 4
    assert (root / "cifar-100-binary.tar.gz").read_bytes() == archive.read_bytes()  # fetched
    assert (root / "cifar-100-binary" / "train.bin").is_file()  # and extracted
