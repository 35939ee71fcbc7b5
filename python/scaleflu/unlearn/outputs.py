"""Writing an unlearning's outputs, and erasing a served request from the history store.

Library functions (the ``unlearn`` sub-command and the testbed's server use them):
:func:`write_unlearning` writes what :func:`scaleflu.unlearn.run.run_unlearning` returned
in memory — ``model.safetensors``, ``result.json``, ``config.yaml`` and, for SCALE,
``sensitivity.json`` and its figures; :func:`erase_history` deletes a request's targets'
stored updates.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from scaleflu.config import save_config
from scaleflu.fl.integrity import key_for, save_model
from scaleflu.log import fmt
from scaleflu.plots import plot_rewards, plot_sensitivity, plot_sum_aoi
from scaleflu.unlearn.base import resolve_unlearn_config
from scaleflu.unlearn.registry import canonical_name

log = logging.getLogger(__name__)


def write_unlearning(
    done: Any, request: str, method: str, out: str | Path | None = None, erase: bool = False
) -> Path:
    """Write an in-memory unlearning (``run_unlearning``'s answer) to ``out``.

    ``out`` defaults to ``RUN_DIR/unlearn/<request>-<mode or method>``. ``erase``: also erase
    the request's targets from the run's history (:func:`erase_history`), recorded in the
    result's ``erasure``. Returns the folder.
    """
    method = canonical_name(method)
    ctx, result, unlearner, state = done.ctx, done.result, done.unlearner, done.state
    slug = ctx.request.request.slug
    tag = ctx.mode if method == "scale" else method
    out_dir = Path(out) if out else Path(ctx.run.run_dir) / "unlearn" / f"{slug}-{tag}"
    out_dir.mkdir(parents=True, exist_ok=True)
    save_config(resolve_unlearn_config(ctx.cfg), out_dir / "config.yaml")
    model_path = out_dir / "model.safetensors"
    # with its digest under the run's key when it is trusted (--keys), wherever out is
    save_model(state, model_path, key_for(ctx.run.run_dir))
    result.model_path = str(model_path)
    if erase:
        result.erasure = erase_history(ctx.run.history, ctx.request.targets, request, state)
    result.save(out_dir / "result.json")
    if method == "scale":
        unlearner.report.save(out_dir / "sensitivity.json")
        plot_sensitivity(unlearner.report, out_dir / "sensitivity.png")
        plot_rewards(result.details["episode_returns"], out_dir / "ppo_reward.png")
        plot_sum_aoi(result.aoi["sum_s_trace"], out_dir / "sum_aoi.png")
    m = result.metrics
    log.info(
        "%s %s: test %.3f RA %.3f FA %.3f FA(protocol %s) %s, wall %.1fs -> %s",
        result.method,
        request,
        m["test_acc"] or 0.0,
        m["ra"] or 0.0,
        m["fa"] or 0.0,
        result.protocol,
        fmt(m["fa_protocol"]),
        result.cost["wall_s"],
        out_dir,
    )
    return out_dir


def erase_history(
    history: Any, targets: list[int], request: str, state: dict[str, Any] | None
) -> dict[str, Any]:
    """Erase what the history store holds of a served request; return what was erased.

    Every stored update of the request's target clients is deleted: for a client request they
    are the forgotten robot's own updates; for a class or sample request each target's updates
    were computed on the forgotten data as well, and the store cannot separate the parts, so
    they go as a whole. With ``state`` the final global model becomes the unlearned model.
    """
    summary = history.erase_clients(targets, reason=request)
    if state is not None:
        history.replace_final(state)
    summary["final_model_replaced"] = state is not None
    return summary
