"""Unlearning requests: parsing, validation and resolution to index sets."""

from __future__ import annotations

import numpy as np
import pytest

from scaleflu.unlearn.request import RequestError, parse_request, resolve_request

PARTS = [np.arange(0, 10), np.arange(10, 20), np.arange(20, 30)]
LABELS = np.array([i % 3 for i in range(30)])


def test_parse_forms() -> None:
    r = parse_request("client:7")
    assert (r.kind, r.clients) == ("client", (7,))
    assert parse_request("client:3,7").clients == (3, 7)
    c = parse_request("class:3")
    assert (c.kind, c.classes, c.clients) == ("class", (3,), ())
    assert parse_request("class:3,5@7").clients == (7,)
    s = parse_request("sample:7:0.1")
    assert (s.kind, s.clients, s.fraction) == ("sample", (7,), 0.1)
    assert s.slug == "sample-7-0.1"


@pytest.mark.parametrize(
    "text, msg",
    [
        ("node:1", "unknown kind"),
        ("client:", "no client ids"),
        ("client:a", "integers"),
        ("sample:1", "sample:CLIENT:FRACTION"),
        ("sample:1:1.5", "fraction must be in"),
        ("sample:1:x", "not a number"),
    ],
)
def test_parse_errors(text: str, msg: str) -> None:
    with pytest.raises(RequestError, match=msg):
        parse_request(text)


def test_resolve_client_and_remaining_partition() -> None:
    res = resolve_request(parse_request("client:1"), PARTS, LABELS, 3)
    assert res.targets == [1]
    assert np.array_equal(res.forget[1], PARTS[1])
    assert res.removed_clients == [1]
    assert len(res.remaining_indices) == 20
    assert res.protocol == "clean"


def test_resolve_class_whole_federation_and_one_client() -> None:
    res = resolve_request(parse_request("class:2"), PARTS, LABELS, 3)
    assert res.targets == [0, 1, 2]
    assert set(LABELS[res.forget_indices]) == {2}
    assert not np.isin(res.remaining_indices, res.forget_indices).any()
    assert len(res.forget_indices) + len(res.remaining_indices) == 30
    one = resolve_request(parse_request("class:2@1"), PARTS, LABELS, 3)
    assert one.targets == [1] and set(one.forget[1]) == {11, 14, 17}
    assert one.forget_share(1, 10) == pytest.approx(0.3)


def test_resolve_sample_takes_poisoned_first() -> None:
    flipped = np.array([12, 15, 18])
    res = resolve_request(parse_request("sample:1:0.3"), PARTS, LABELS, 3, flipped_indices=flipped)
    assert np.array_equal(res.forget[1], flipped)
    assert res.protocol == "label_flip"
    more = resolve_request(parse_request("sample:1:0.5"), PARTS, LABELS, 3, flipped_indices=flipped)
    assert len(more.forget[1]) == 5 and np.isin(flipped, more.forget[1]).all()
    assert more.notes


@pytest.mark.parametrize(
    "text, msg",
    [
        ("client:5", "unknown client"),
        ("client:1,1", "listed twice"),
        ("class:9", "outside"),
        ("sample:0:0.01", "empty forget set"),
        ("client:0,1,2", "nothing would remain"),
    ],
)
def test_resolve_errors(text: str, msg: str) -> None:
    with pytest.raises(RequestError, match=msg):
        resolve_request(parse_request(text), PARTS, LABELS, 3)


def test_class_not_present() -> None:
    labels = LABELS.copy()
    labels[labels == 2] = 1
    with pytest.raises(RequestError, match="not present"):
        resolve_request(parse_request("class:2"), PARTS, labels, 3)
    with pytest.raises(RequestError, match="not present"):
        resolve_request(parse_request("class:2@0"), PARTS, labels, 3)


def test_whole_class_is_a_class_removed_from_every_client() -> None:
    assert parse_request("class:3").whole_class and parse_request("class:3,5").whole_class
    assert not parse_request("class:3@7").whole_class
    assert not parse_request("client:7").whole_class
    assert not parse_request("sample:7:0.1").whole_class
