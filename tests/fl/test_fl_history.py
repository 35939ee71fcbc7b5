"""History store: round records, updates, retention, fp16, AoI groups, crash cleanup."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from scaleflu.fl.history import HistoryStore, LinkModel, state_bytes
from scaleflu.fl.models import build_model, layer_groups


def _fill(store: HistoryStore, rounds: int) -> list[dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    g = {k: v.clone() for k, v in build_model("lenet", 10, 1, 28).state_dict().items()}
    globals_ = [g]
    store.record_initial(g)
    for t in range(1, rounds + 1):
        clients = {n: {k: v + 0.01 * (n + 1) for k, v in g.items()} for n in (t % 3, 3 + t % 2)}
        new = {k: v + 0.001 * t for k, v in g.items()}
        if t == 2:  # fc3.weight unchanged in round 2
            new["fc3.weight"] = g["fc3.weight"].clone()
        store.record_round(
            t,
            list(clients),
            {n: 10 * (n + 1) for n in clients},
            clients,
            new,
            {"test_acc": 0.1 * t},
            wall_s=0.5,
        )
        g = new
        globals_.append(g)
    return globals_


def _store(path: Path, **kw: object) -> HistoryStore:
    groups = layer_groups(build_model("lenet", 10, 1, 28), 4)
    return HistoryStore(path, groups=groups, **kw)  # type: ignore[arg-type]


def test_record_and_read_back(tmp_path: Path) -> None:
    store = _store(tmp_path)
    globals_ = _fill(store, 4)
    assert store.rounds() == [1, 2, 3, 4] and store.last_completed_round() == 4
    assert store.participants(1) == [1, 4]
    assert store.data_sizes(1) == {1: 20, 4: 50}
    assert store.metrics(3) == {"test_acc": pytest.approx(0.3)}
    upd = store.client_update(3, 0)
    assert torch.allclose(upd["fc1.weight"], torch.full_like(upd["fc1.weight"], 0.01), atol=1e-6)
    assert set(store.client_updates(3)) == {0, 4}
    for t, g in enumerate(globals_, start=1):
        assert torch.equal(store.global_model(t)["conv1.weight"], g["conv1.weight"])
    assert torch.equal(store.final_model()["fc3.bias"], globals_[-1]["fc3.bias"])
    model = store.client_model(2, 2)
    assert torch.allclose(model["fc3.bias"], globals_[1]["fc3.bias"] + 0.03, atol=1e-6)
    assert store.client_rounds(4) == [1, 3]
    with pytest.raises(KeyError):
        store.client_update(1, 2)
    with pytest.raises(KeyError):
        store.global_model(9)
    with pytest.raises(ValueError, match="out of order"):
        store.record_round(9, [], {}, {}, globals_[-1])


def test_link_accounting_and_group_last_update(tmp_path: Path) -> None:
    link = LinkModel(goodput=1e5, latency=0.01, count_uplink=True)
    store = _store(tmp_path, link=link)
    globals_ = _fill(store, 3)
    nbytes = state_bytes(globals_[0])
    per = nbytes / 1e5 + 0.01
    assert store.link_seconds(0) == pytest.approx(per)
    assert store.link_seconds(1) == pytest.approx(3 * per)  # two uploads + one broadcast
    assert store.cumulative_link_seconds(3) == pytest.approx(10 * per)
    assert store.round_info(1)["bytes"] == 3 * nbytes
    last = store.group_last_update()
    assert len(last) == sum(len(g) for g in store.groups.values())
    assert last[("conv1.weight", 0)] == (3, pytest.approx(10 * per))
    as_of_2 = store.group_last_update(as_of=2)
    assert as_of_2[("fc3.weight", 1)] == (1, pytest.approx(4 * per))  # unchanged in round 2
    assert as_of_2[("fc2.weight", 1)][0] == 2
    assert store.group_last_update(tol=1.0)[("conv1.weight", 0)] == (0, pytest.approx(per))
    assert store.group_changes(2)[("fc3.weight", 0)] == 0.0


def test_retention_fp16_and_reopen(tmp_path: Path) -> None:
    store = _store(tmp_path, keep_rounds=2, fp16=True)
    globals_ = _fill(store, 5)
    assert [store.has_updates(t) for t in range(1, 6)] == [False, False, False, True, True]
    with pytest.raises(KeyError, match="dropped"):
        store.client_update(1, 1)
    assert store.client_update(5, 2)["fc1.weight"].dtype == torch.float32
    assert store.global_model(1)["fc1.weight"].dtype == torch.float32
    sizes = store.storage_bytes()
    assert sizes["total"] == sizes["globals"] + sizes["updates"] + sizes["sqlite"] > 0
    store.close()
    again = HistoryStore(tmp_path)
    assert again.keep_rounds == 2 and again.fp16 and again.last_completed_round() == 5
    assert torch.equal(again.final_model()["fc3.bias"], globals_[-1]["fc3.bias"])


def test_uncommitted_files_removed_on_open(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _fill(store, 2)
    store.close()
    hist = tmp_path / "history"
    (hist / "global_00004.safetensors").write_bytes(b"partial")
    (hist / "updates_00003.safetensors").write_bytes(b"partial")
    (hist / "x.tmp").write_bytes(b"partial")
    again = HistoryStore(tmp_path)
    assert again.last_completed_round() == 2
    assert not (hist / "global_00004.safetensors").exists()
    assert not (hist / "updates_00003.safetensors").exists()
    assert (hist / "global_00003.safetensors").exists()


def test_batchnorm_buffers_in_updates(tmp_path: Path) -> None:
    model = build_model("resnet18", 10, 1, 28)
    store = HistoryStore(tmp_path, groups=layer_groups(model, 2))
    g = {k: v.clone() for k, v in model.state_dict().items()}
    store.record_initial(g)
    local = {k: (v + 1 if v.is_floating_point() else v + 3) for k, v in g.items()}
    store.record_round(1, [0], {0: 5}, {0: local}, local)
    upd = store.client_update(1, 0)
    assert "bn1.running_mean" in upd and "bn1.num_batches_tracked" not in upd
    assert torch.allclose(upd["bn1.running_var"], torch.ones_like(upd["bn1.running_var"]))
    assert int(store.final_model()["bn1.num_batches_tracked"]) == 3
    assert int(store.client_model(1, 0)["bn1.num_batches_tracked"]) == 0  # from Theta[1]


def test_erase_clients_deletes_their_updates_only(tmp_path: Path) -> None:
    store = _store(tmp_path)
    globals_ = _fill(store, 4)  # participants: 1 {1, 4}, 2 {2, 3}, 3 {0, 4}, 4 {1, 3}
    keep_0 = store.client_update(3, 0)
    keep_1 = store.client_update(1, 1)
    size3 = store._updates_path(3).stat().st_size
    summary = store.erase_clients([4], reason="client:4")
    assert summary["clients"] == [4] and summary["rounds"] == [1, 3]
    assert summary["updates"] == 2
    n_float = sum(v.numel() for v in globals_[0].values() if v.is_floating_point())
    assert summary["bytes"] == 2 * n_float * 4  # two float32 updates
    assert summary["derived_kept_rounds"] == [1, 2, 3, 4]
    # gone from the files on disk, from the participants and from the data sizes
    for t in (1, 3):
        with safe_open(str(store._updates_path(t)), framework="pt") as fh:
            assert not [k for k in fh.keys() if k.startswith("4/")]  # noqa: SIM118
        assert 4 not in store.participants(t) and 4 not in store.data_sizes(t)
        with pytest.raises(KeyError):
            store.client_update(t, 4)
    assert store._updates_path(3).stat().st_size < size3
    assert store.client_rounds(4) == []
    # the other clients' updates are bit-exact as before; untouched rounds unchanged
    assert all(torch.equal(keep_0[k], v) for k, v in store.client_update(3, 0).items())
    assert all(torch.equal(keep_1[k], v) for k, v in store.client_update(1, 1).items())
    assert store.participants(2) == [2, 3] and set(store.client_updates(3)) == {0}
    log = store.erased()
    assert [(r["round"], r["client"], r["data_size"]) for r in log] == [(1, 4, 50), (3, 4, 50)]
    assert store.erased_clients() == {4}
    # idempotent, persists across reopening
    assert store.erase_clients([4])["updates"] == 0
    store.close()
    store = _store(tmp_path)
    assert store.erased_clients() == {4} and 4 not in store.participants(1)
    # a round whose every participant is erased keeps no update file
    store.erase_clients([2, 3])
    assert not store.has_updates(2) and not store._updates_path(2).exists()
    assert store.participants(2) == [] and store.participants(4) == [1]


def test_replace_final(tmp_path: Path) -> None:
    store = _store(tmp_path)
    globals_ = _fill(store, 2)
    new = {k: torch.zeros_like(v) for k, v in globals_[-1].items()}
    store.replace_final(new)
    assert all(torch.equal(v, new[k].float()) for k, v in store.final_model().items())
    assert torch.equal(store.global_model(2)["fc1.weight"], globals_[1]["fc1.weight"])


def test_link_model_of_the_coded_phy_uses_the_mcs_table():
    """history.link_phy: the paper's stock link is bytes / goodput; the coded PHY's link takes
    its airtime from the MCS table and the measured error curves, adaptive at least as fast as
    any one MCS, slower on a fading channel, and refused where nothing gets through."""
    from scaleflu.link.mcs import frame_airtime_s

    n = 247_210  # a LeNet-5 update
    stock = LinkModel()
    assert stock.seconds(n) == pytest.approx(n / stock.goodput + stock.latency)
    top = LinkModel(phy="64qam-3/4", snr_db=25.0, latency=0.0)
    frames = -(-n // 1474)
    assert top.seconds(n) == pytest.approx(
        (frames - 1) * frame_airtime_s("64qam-3/4", 1500)
        + frame_airtime_s("64qam-3/4", n - (frames - 1) * 1474 + 26),
        rel=1e-6,
    )
    ad = {s: LinkModel(phy="auto", snr_db=s, latency=0.0).seconds(n) for s in (6, 12, 20, 30)}
    assert ad[6] > ad[12] > ad[20] >= ad[30]  # higher SNR, faster MCS
    assert ad[30] == pytest.approx(top.seconds(n), rel=1e-6)
    assert LinkModel(phy="adaptive", snr_db=20.0, fading="rician").seconds(n) > ad[20]
    assert LinkModel(phy="adaptive").phy == "adaptive"
    with pytest.raises(ValueError, match="no frame gets through"):
        LinkModel(phy="64qam-3/4", snr_db=5.0)
    with pytest.raises(ValueError):
        LinkModel(phy="qpsk-9/10")
