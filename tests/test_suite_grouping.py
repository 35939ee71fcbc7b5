"""The suite's parallel schedule: tests sharing a module fixture run on one worker."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def shared() -> object:
    return object()


def test_a_module_fixtures_tests_are_one_xdist_group(request: pytest.FixtureRequest, shared):
    """Under ``--dist loadgroup`` (``make test``) this test's node id carries its module's group
    (pytest-xdist's worker appends it; with pytest 9.2 it silently did not, and every module
    fixture was built again on each worker)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not under pytest-xdist --dist loadgroup")
    assert request.node.nodeid.endswith("@tests/test_suite_grouping.py"), request.node.nodeid
    assert request.node.get_closest_marker("xdist_group") is not None
