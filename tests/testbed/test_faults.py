"""The robot's fault hooks: they strike in their round only and leave the honest path alone."""

from __future__ import annotations

import numpy as np
import pytest

from scaleflu.testbed.faults import FAULTS, NO_FAULTS, RobotFaults


def _state() -> dict[str, np.ndarray]:
    return {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(4, dtype=np.int64)}


def test_unknown_faults_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"unknown faults \['nam'\]; choose from nan, shape"):
        RobotFaults(("nam",))
    assert set(FAULTS) >= {"scaled", "free_ride", "crash", "forged"}


def test_uploads_are_replaced_only_in_the_fault_round() -> None:
    received = _state()
    local = {"w": received["w"] + 0.5, "n": np.array(5, dtype=np.int64)}
    scaled = RobotFaults(("scaled",), fault_round=2)
    for t in (1, 3):
        assert scaled.replace_upload(t, local, received) is local
    up = scaled.replace_upload(2, local, received)
    np.testing.assert_array_equal(up["w"], received["w"] + 50.0)
    assert up["w"].dtype == np.float32 and int(up["n"]) == 5
    free = RobotFaults(("free_ride",), fault_round=2).replace_upload(2, local, received)
    np.testing.assert_array_equal(free["w"], received["w"])
    assert NO_FAULTS.replace_upload(2, local, received) is local


def test_the_honest_robot_sends_nothing_extra() -> None:
    class Nothing:
        """Any use of the robot's endpoint fails the test."""

        robot_id, session, key = 1, 1, b"k" * 32

        @property
        def ep(self):
            raise AssertionError("the honest path sent something")

    NO_FAULTS.before_training(Nothing(), 1)
    NO_FAULTS.before_upload(Nothing(), 1, _state(), {}, 1.0)
    NO_FAULTS.after_upload(Nothing(), 1, {}, b"", b"", 1.0)
    RobotFaults(("nan", "duplicate"), fault_round=2).before_upload(Nothing(), 1, _state(), {}, 1.0)
