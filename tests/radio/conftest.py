"""Fixtures of the GNU Radio tests: skip cleanly without GNU Radio, close networks after each."""

from __future__ import annotations

import pytest

gr = pytest.importorskip("gnuradio.gr", reason="GNU Radio is not installed")
pytest.importorskip("gnuradio.scaleflu", reason="the scaleflu C++ blocks are not built")

from scaleflu.link.samples import lenet_like  # noqa: E402


@pytest.fixture
def lenet_state_dict():
    return lenet_like


@pytest.fixture(autouse=True)
def _close_networks():
    yield
    from scaleflu.linkkinds import close_links

    close_links()
