"""Erasure receipts: signed by the run's key on `scaleflu unlearn --erase`, kept in the
history's chain, checked offline by `scaleflu receipt verify` (what it proves, what not); a
tampered receipt, one signed by another key, or one for a different model fails with one
line; a robot refuses such receipts and one of a history older than a receipt it holds.
(Sending by the edge server and the robot's check of a genuine one: tests/testbed/
test_server_robot.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from scaleflu.fl.history import HistoryStore
from scaleflu.fl.integrity import untrust
from scaleflu.keys import load_integrity_key, public_bytes, receipt_signer, write_integrity_key
from scaleflu.unlearn.receipt import (
    RECEIPT_VERSION,
    ReceiptError,
    build_receipt,
    model_file_sha256,
    read_receipt,
    receipt_sha256,
    receipt_text,
    sign_receipt,
    verify_receipt,
)
from tiny_run_helpers import needs_fmnist

COMMON = [
    "--set", "data.num_clients=2", "--set", "fl.clients_per_round=2",
    "--set", "data.train_subset=300", "--set", "data.test_subset=100",
    "--set", "fl.rounds=2", "--set", "fl.local_epochs=1", "--set", "fl.threads=1",
]  # fmt: skip


@pytest.fixture(scope="module")
def erased(tmp_path_factory):
    """A tiny run trained and unlearned with `--keys` and `--erase` (client 0, then 1)."""
    from scaleflu.cli import main

    tmp = tmp_path_factory.mktemp("receipts")
    key = write_integrity_key(tmp / "integrity.json")
    run = tmp / "run"
    assert main(["train", "--out", str(run), "--keys", str(key), "--no-progress", *COMMON]) == 0
    outs = []
    for n in (0, 1):
        out = tmp / f"u{n}"
        argv = ["unlearn", "--run", str(run), "--request", f"client:{n}", "--method",
                "finetune", "--keys", str(key), "--out", str(out), "--no-progress", "--erase",
                "--set", "baselines.finetune.rounds=1"]  # fmt: skip
        argv += ["--evaluate"] if n == 0 else []  # the second: no scores measured
        assert main(argv) == 0
        untrust(run)
        outs.append(out)
    return run, key, outs


pytestmark = needs_fmnist


def _verify(capsys, *argv: str) -> tuple[int, str]:
    from scaleflu.cli import main

    capsys.readouterr()
    rc = main(["receipt", "verify", *argv])
    got = capsys.readouterr()
    return rc, got.out + got.err


def test_erase_writes_a_receipt_the_cli_verifies_offline(erased, capsys):
    run, key, (out, _) = erased
    model = str(out / "model.safetensors")
    rc, text = _verify(capsys, str(out / "receipt.json"), "--key", str(key), "--model", model)
    assert rc == 0, text
    assert "receipt VALID" in text and "the model given" in text
    assert "It proves that this server signed" in text and "client:0" in text
    assert "stored updates of client(s) [0] in rounds [1, 2] were erased" in text
    assert "It does not prove" in text and "statistical sense" in text
    assert "that no copy exists elsewhere" in text
    r = read_receipt(out / "receipt.json")
    result = json.loads((out / "result.json").read_text())
    assert result["erasure"]["receipt"]["sha256"] == receipt_sha256(r)
    assert r["model_after"]["sha256"] == model_file_sha256(out / "model.safetensors")
    assert r["audit"]["metrics"]["test_acc"] == result["metrics"]["test_acc"]
    assert [u["client"] for u in r["erasure"]["updates"]] == [0, 0]
    assert all(len(u["sha256"]) == 64 for u in r["erasure"]["updates"])
    unmeasured = erased[2][1]  # unlearned without --evaluate: the receipt says no scores
    rc, text = _verify(capsys, str(unmeasured / "receipt.json"), "--key", str(key))
    assert rc == 0 and "none recorded" in text, text
    assert not read_receipt(unmeasured / "receipt.json")["audit"].get("metrics")


def test_receipts_are_kept_in_the_history_chain(erased):
    run, key, (first, second) = erased
    a, b = read_receipt(first / "receipt.json"), read_receipt(second / "receipt.json")
    assert a["previous"] is None and b["previous"] == receipt_sha256(a)
    assert b["history"]["version"] > a["history"]["version"]
    # the second request started from the first one's model: the receipts chain up
    assert b["model_before"]["sha256"] == a["model_after"]["sha256"]
    with HistoryStore(run, integrity_key=load_integrity_key(key)) as h:
        kept = h.receipts()
        assert [k["sha256"] for k in kept] == [receipt_sha256(a), receipt_sha256(b)]
        assert json.loads(kept[0]["body"]) == a


def test_a_receipt_for_another_model_fails_in_one_line(erased, capsys):
    run, key, (out, _) = erased
    # the run's model before the request: the receipt is not about it
    model = str(run / "model.safetensors")
    rc, text = _verify(capsys, str(out / "receipt.json"), "--key", str(key), "--model", model)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert rc == 1 and len(lines) == 1, text
    assert "not about this model" in lines[0] and "the model before the request" in lines[0]


def test_a_tampered_receipt_fails_in_one_line(erased, capsys, tmp_path):
    _, key, (out, _) = erased
    r = read_receipt(out / "receipt.json")
    r["erasure"]["clients"] = [1]  # claim another client was erased
    bad = tmp_path / "tampered.json"
    bad.write_text(json.dumps(r))
    rc, text = _verify(capsys, str(bad), "--key", str(key))
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert rc == 1 and len(lines) == 1, text
    assert "receipt INVALID" in lines[0] and "changed after it was signed" in lines[0]
    # signed again by someone else's key: not the server's
    other = sign_receipt(r, Ed25519PrivateKey.generate())
    bad.write_text(json.dumps(other))
    rc, text = _verify(capsys, str(bad), "--key", str(key))
    assert rc == 1 and "signed by another key" in text
    # not a receipt at all, and no key given
    bad.write_text("{")
    assert _verify(capsys, str(bad), "--key", str(key))[0] == 1
    rc, text = _verify(capsys, str(out / "receipt.json"))
    assert rc == 2 and "proves nothing" in text


def test_the_public_key_alone_verifies(erased, capsys):
    _, key, (out, _) = erased
    pub = public_bytes(receipt_signer(key)).hex()
    rc, text = _verify(capsys, str(out / "receipt.json"), "--public-key", pub)
    assert rc == 0 and "receipt VALID" in text


# ----------------------------------------------------------------------------- the robot's check


SK = Ed25519PrivateKey.generate()
A, B, U = "a" * 64, "b" * 64, "c" * 64


def _receipt(version: int = 5, after: str = A, update: str = U, key=SK) -> dict:
    r = build_receipt(
        request={"text": "client:0", "kind": "client", "targets": [0], "robot": 1},
        method="scale",
        mode="default",
        before_sha256=B,
        after_sha256=after,
        changed={"tensors": ["w"], "groups": {"w": [0]}, "groups_total": 2},
        erasure={
            "clients": [0],
            "rounds": [1],
            "erased_updates": [{"round": 1, "client": 0, "sha256": update, "bytes": 4}],
            "bytes": 4,
        },
        result={"metrics": {"test_acc": 0.8, "mia_auc": float("nan")}},
        history={"store_id": "s1", "version": version, "head": "h"},
        previous=None,
    )
    return sign_receipt(r, key)


class _Robot:
    """What the robot's receipt check reads (its evaluations, its rounds, the server's key)."""

    from scaleflu.testbed.robot import RobotClient

    _on_receipt = RobotClient._on_receipt
    _check_own_updates = RobotClient._check_own_updates

    def __init__(self) -> None:
        self.robot_id = 1
        self.server_public_key = public_bytes(SK)
        self.evals = {"before": {"sha256": B}, "unlearned": {"sha256": A}}
        self.rounds = [{"round": 1, "update_sha256": U}]
        self.receipts: list = []
        self.receipt_checks: list = []
        self.rejects: list = []
        self.heads: dict = {}
        self.receipts_dir: Path | None = None


def _send(robot: _Robot, receipt: dict, version: int = RECEIPT_VERSION) -> str | None:
    n = len(robot.rejects)
    robot._on_receipt({"receipt_version": version}, receipt_text(receipt).encode())
    return robot.rejects[-1]["detail"] if len(robot.rejects) > n else None


def test_a_robot_keeps_a_good_receipt_and_refuses_bad_ones(tmp_path):
    robot = _Robot()
    robot.receipts_dir = tmp_path
    assert _send(robot, _receipt()) is None
    assert robot.heads == {"s1": 5} and robot.receipt_checks[0]["own_updates_matched"] == 1
    assert len(list(tmp_path.glob("receipt-*.json"))) == 1
    assert json.loads((next(tmp_path.glob("*.json"))).read_text())["audit"]["metrics"] == {
        "test_acc": 0.8,
        "mia_auc": None,
    }
    tampered = _receipt(version=6)
    tampered["erasure"]["bytes"] = 0
    assert "receipt INVALID" in _send(robot, tampered)
    assert "signed by another key" in _send(robot, _receipt(6, key=Ed25519PrivateKey.generate()))
    assert "not about the model this robot was sent" in _send(robot, _receipt(6, after="d" * 64))
    assert "not the one this robot uploaded" in _send(robot, _receipt(6, update="e" * 64))
    assert "went back" in _send(robot, _receipt(version=5))
    assert "not supported" in _send(robot, _receipt(6), version=99)
    assert len(robot.receipts) == 1 and all(x["reason"] == "bad_receipt" for x in robot.rejects)
    assert _send(robot, _receipt(version=7)) is None and robot.heads == {"s1": 7}


def test_verify_receipt_names_the_model_it_is_about():
    r = _receipt()
    v = verify_receipt(r, public_bytes(SK), A)
    assert v.after == A and v.before == B and v.version == 5
    with pytest.raises(ReceiptError, match="the model before the request"):
        verify_receipt(r, public_bytes(SK), B)
