"""Membership canaries (data.poison.canaries) and the sample request that forgets them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scaleflu.config import ConfigError
from scaleflu.fl.data import ImageData, PoisonInfo, apply_poison, insert_canaries
from scaleflu.unlearn.request import parse_request, resolve_request


def _data(n: int = 400) -> ImageData:
    rng = np.random.default_rng(0)
    return ImageData(
        torch.from_numpy(rng.integers(0, 256, (n, 1, 28, 28)).astype(np.uint8)),
        torch.from_numpy(rng.integers(0, 4, n)),
        (0.5,),
        (0.3,),
        4,
    )


def _parts(n: int = 400) -> list[np.ndarray]:
    return [np.arange(0, 200), np.arange(200, 300), np.arange(300, n)]


CFG = {
    "label_flip_clients": [1],
    "label_flip_fraction": 0.3,
    "canary_clients": [0, 1],
    "canaries": 6,
    "canary_copies": 3,
}


def _setup(cfg: dict = CFG) -> tuple[ImageData, ImageData, list[np.ndarray], PoisonInfo]:
    clean, parts = _data(), _parts()
    train, poison = apply_poison(clean, parts, cfg, seed=0)
    return insert_canaries(clean, train, parts, cfg, poison, seed=0)


def test_canaries_are_duplicated_relabelled_and_matched() -> None:
    clean, train, parts, poison = _setup()
    table, held = poison.canary_copies, poison.canary_heldout
    assert table.shape == (12, 3) and held.shape == (12,)
    assert len(train) == len(clean) == 400 + 12 * 2  # two extra copies per canary
    true = clean.labels
    m = torch.as_tensor(poison.canary_members)
    h = torch.as_tensor(held)
    assert torch.equal(true[m], true[h])  # class-matched twins
    assert bool((train.labels[m] != true[m]).all())
    assert torch.equal(train.labels[h], train.labels[m])  # twins: same wrong label
    assert len(set(train.labels[m].tolist())) > 1  # random labels, not one mapping
    for row in table:  # every copy is the same image with the same (wrong) label
        r = torch.as_tensor(row)
        assert bool((train.pixels[r] == train.pixels[r[0]]).all())
        assert len(set(train.labels[r].tolist())) == 1
        assert torch.equal(clean.labels[r], true[r[:1]].expand(3))
    allp = np.concatenate(parts)
    assert len(allp) == len(np.unique(allp))
    assert not np.isin(held, allp).any()  # the twins are trained on by nobody
    assert np.isin(table[:6], parts[0]).all() and np.isin(table[6:], parts[1]).all()
    assert not np.isin(table, poison.flipped_indices).any()  # drawn from clean samples
    assert len(parts[0]) == 200 - 6 + 12 and len(parts[1]) == 100 - 6 + 12


def test_no_canaries_leaves_the_data_untouched() -> None:
    clean, parts = _data(), _parts()
    cfg = {**CFG, "canaries": 0}
    train, poison = apply_poison(clean, parts, cfg, seed=0)
    c2, t2, p2, q2 = insert_canaries(clean, train, parts, cfg, poison, seed=0)
    assert c2 is clean and t2 is train and q2 is poison
    assert all(np.array_equal(a, b) for a, b in zip(parts, p2, strict=True))


@pytest.mark.parametrize(
    "bad",
    [{"canary_clients": [5]}, {"canaries": 80}, {"canaries": -1}, {"canary_copies": 0}],
)
def test_bad_canary_config_is_an_error(bad: dict) -> None:
    with pytest.raises(ConfigError):
        _setup({**CFG, **bad})


def test_sample_request_takes_whole_canaries() -> None:
    _, train, parts, poison = _setup()
    args = (parts, train.labels, 4, poison.backdoor_indices, poison.flipped_indices, 0)
    res = resolve_request(parse_request("sample:1:poisoned"), *args, poison.canary_copies)
    fi = res.forget_indices
    flipped_1 = np.intersect1d(poison.flipped_indices, parts[1])
    assert np.isin(poison.canary_copies[6:], fi).all()  # all client 1's canaries, every copy
    assert not np.isin(poison.canary_copies[:6], fi).any()
    assert len(fi) == len(flipped_1) + 18 and np.isin(flipped_1, fi).all()
    assert res.protocol == "label_flip"
    # a fraction cutting into the canaries never splits one: whole rows only
    res = resolve_request(parse_request("sample:1:0.1"), *args, poison.canary_copies)
    rows = poison.canary_copies[6:]
    inside = np.isin(rows, res.forget_indices)
    assert all(r.all() or not r.any() for r in inside) and inside.any()
    # the client request forgets the attacker's canaries with the rest of its data
    res = resolve_request(parse_request("client:0"), *args, poison.canary_copies)
    assert np.isin(poison.canary_copies[:6], res.forget_indices).all()
    with pytest.raises(Exception, match="no poisoned"):
        resolve_request(parse_request("sample:2:poisoned"), *args, poison.canary_copies)
