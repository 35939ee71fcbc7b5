"""The library entry point of unlearning: :func:`run_unlearning` unlearns a request from a
trained run in memory with a method of the registry (:mod:`scaleflu.unlearn.registry`); the
command line (``scaleflu unlearn``), the experiments and the edge server call it, and
:mod:`scaleflu.unlearn.outputs` writes what it returns."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scaleflu.unlearn.base import UnlearnContext, Unlearner, UnlearnResult
from scaleflu.unlearn.registry import (
    PAPER_MODE_WARNING,
    canonical_name,
    hyper_parameters,
    make_method,
)

log = logging.getLogger(__name__)


@dataclass
class Unlearning:
    """What :func:`run_unlearning` returns: the unlearned model and its measured result."""

    state: dict[str, Any]
    result: UnlearnResult
    unlearner: Unlearner
    ctx: UnlearnContext


def run_unlearning(
    run_dir: str | Path,
    request: Any,
    method: str = "scale",
    mode: str | None = None,
    config: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    progress: bool = True,
    run: Any = None,
    prepare: Callable[[UnlearnContext], None] | None = None,
    audit: bool = True,
    measure: bool = True,
    metrics_cache: bool = False,
) -> Unlearning:
    """Unlearn ``request`` (an ``UnlearnRequest`` or its text) from the trained run in
    ``run_dir`` (or the loaded ``run``, e.g. the one an edge server holds), in memory.

    ``mode`` (paper | default; None: ``scale.mode``) is SCALE's mode. ``config``/``overrides``
    may set ``scale.*`` and ``baselines.*`` only. ``prepare(ctx)`` is called with the
    :class:`~scaleflu.unlearn.base.UnlearnContext` once the run, the config and the request are
    resolved and before the method runs (the CLI refuses a request that touches nothing there).
    ``measure`` / ``audit`` / ``metrics_cache``: what the result measures
    (:class:`~scaleflu.unlearn.base.UnlearnContext`). Nothing is written to disk (but the
    metrics cache when asked).
    """
    name = canonical_name(method)
    ctx = UnlearnContext.from_run_dir(
        run_dir,
        request,
        mode or "default",
        config,
        overrides,
        progress,
        run=run,
        audit=audit,
        measure=measure,
        metrics_cache=metrics_cache,
    )
    if mode is None:
        mode = hyper_parameters("scale", ctx.cfg)["mode"] if name == "scale" else None
        ctx.mode = str(mode or ctx.scale_cfg.mode)
    if prepare is not None:
        prepare(ctx)
    if name == "scale" and ctx.mode == "paper":
        log.warning(PAPER_MODE_WARNING)
    extra = {"mode": ctx.mode} if name == "scale" else {}
    unlearner = make_method(name, ctx.cfg, **extra)
    # torch's intra-op threads as `experiment table2` and training set them (fl.threads), for
    # every method, so single runs are comparable and do not swing with the CPU's other load
    threads_before = torch.get_num_threads()
    threads = int(ctx.cfg.fl.threads or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        result = unlearner.run(ctx)
    finally:
        torch.set_num_threads(threads_before)
    state = ctx.last_state if ctx.last_state is not None else getattr(unlearner, "state", None)
    if state is None:
        raise RuntimeError(f"method {name} produced no model state")
    return Unlearning(state, result, unlearner, ctx)
