"""Writing an unlearning's outputs, and erasing a served request from the history store.

Library functions (the ``unlearn`` sub-command and the testbed's server use them):
:func:`write_unlearning` writes what :func:`scaleflu.unlearn.registry.run_unlearning` returned
in memory — ``model.safetensors``, ``result.json``, ``config.yaml`` and, for SCALE,
``sensitivity.json`` and its figures; with ``erase``, also ``receipt.json``, the erasure
receipt signed with the run's key (:mod:`scaleflu.unlearn.receipt`); :func:`erase_history`
deletes a request's targets' stored updates.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def write_unlearning(
    done: Any,
    request: str,
    method: str,
    out: str | Path | None = None,
    erase: bool = False,
    plots: bool = True,
) -> Path:
    """Write an in-memory unlearning (``run_unlearning``'s answer) to ``out``.

    ``out`` defaults to ``RUN_DIR/unlearn/<request>-<mode or method>``. ``erase``: also erase
    the request's targets from the run's history (:func:`erase_history`), recorded in the
    result's ``erasure``, with a signed receipt when the run has a key. ``plots``: SCALE's
    figures (matplotlib is imported only for them). Returns the folder.
    """
    from scaleflu.config import save_config
    from scaleflu.fl.integrity import key_for, save_model
    from scaleflu.log import fmt
    from scaleflu.unlearn.base import resolve_unlearn_config
    from scaleflu.unlearn.registry import canonical_name

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
        result.erasure["receipt"] = write_receipt(done, method, result.erasure, out_dir)
    result.save(out_dir / "result.json")
    if method == "scale":
        unlearner.report.save(out_dir / "sensitivity.json")
        if plots:
            from scaleflu.plots import plot_rewards, plot_sensitivity, plot_sum_aoi

            plot_sensitivity(unlearner.report, out_dir / "sensitivity.png")
            plot_rewards(result.details["episode_returns"], out_dir / "ppo_reward.png")
            plot_sum_aoi(result.aoi["sum_s_trace"], out_dir / "sum_aoi.png")
    m = result.metrics
    if m:
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
    else:
        log.info(
            "%s %s: wall %.1fs -> %s (metrics not measured: --evaluate, --audit)",
            result.method,
            request,
            result.cost["wall_s"],
            out_dir,
        )
    return out_dir


def write_receipt(
    done: Any, method: str, erasure: dict[str, Any], out_dir: Path
) -> dict[str, Any] | None:
    """Sign the erasure receipt of an erased request with the run's key (``--keys``), keep it
    in the run's history and write ``out_dir/receipt.json``; what was written (None: the run
    has no key, so nothing can sign it)."""
    from scaleflu.fl.integrity import signer_for, state_sha256
    from scaleflu.unlearn.receipt import changed_parts, issue_receipt, receipt_sha256, receipt_text

    ctx = done.ctx
    signer = signer_for(ctx.run.run_dir)
    if signer is None:
        log.warning("erased without a key (--keys): no erasure receipt, nothing to sign it with")
        return None
    before = ctx.original_state()
    req = ctx.request.request
    request = {
        "text": req.text,
        "kind": req.kind,
        "targets": [int(n) for n in ctx.request.targets],
        "classes": list(req.classes) if req.kind == "class" else None,
        "fraction": req.fraction,
        "robot": None,
    }
    receipt = issue_receipt(
        ctx.run.history,
        signer,
        request=request,
        method=method,
        mode=ctx.mode if method == "scale" else None,
        before_sha256=state_sha256(before),
        after_sha256=state_sha256(done.state),
        changed=changed_parts(before, done.state, ctx.run.history.groups),
        erasure=erasure,
        result=done.result.to_dict(),
    )
    path = out_dir / "receipt.json"
    path.write_text(receipt_text(receipt))
    log.info(
        "erasure receipt %s (history version %d); check it with: scaleflu receipt verify %s "
        "--key KEY_FILE --model %s",
        path,
        receipt["history"]["version"],
        path,
        out_dir / "model.safetensors",
    )
    return {
        "path": path.name,
        "sha256": receipt_sha256(receipt),
        "history_version": receipt["history"]["version"],
    }


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
