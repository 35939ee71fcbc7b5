"""SCALE for Flower: unlearning, with the runtime's history store and audit, in a stock Flower app.

* :class:`~scaleflu.flower.strategy.UnlearningStrategy` (server side): wraps any strategy of
  Flower's Message API, records every client's update of every round into the runtime's
  history store, and serves the clients' unlearning requests with SCALE or any registered
  method, side by side with Retrain and the fine-tune control.
* :mod:`scaleflu.flower.client` (ClientApp side): ``add_registration``, ``request_forget``,
  ``reply``.
* :class:`~scaleflu.flower.grid.InProcessGrid`: a Grid that runs ClientApps in this process
  (tests, benchmarks).

Flower (``flwr``) is an optional dependency: ``pip install 'gr-scaleflu[flower]'``. The example
app is ``examples/flower_unlearning``; the guide is docs/flower.md.
"""

from __future__ import annotations

try:
    import flwr  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "scaleflu.flower needs Flower: pip install 'gr-scaleflu[flower]' (flwr[simulation])"
    ) from exc

from scaleflu.flower.strategy import QueuedRequest, ServedRequest, UnlearningStrategy

__all__ = ["QueuedRequest", "ServedRequest", "UnlearningStrategy"]
