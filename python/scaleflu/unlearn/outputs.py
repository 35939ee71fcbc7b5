"""Writing an unlearning's outputs, and erasing a served request from the history store.

Library functions (the ``unlearn`` sub-command and the testbed's server use them):
:func:`write_unlearning` writes what :func:`scaleflu.unlearn.run.run_unlearning` returned
in memory — ``model.safetensors``, ``result.json``, ``config.yaml`` and, for SCALE,
``sensitivity.json`` and its figures; with ``erase``, also ``receipt.json``, the erasure
receipt signed with the run's key (:mod:`scaleflu.unlearn.receipt`); :func:`erase_history`
deletes a request's targets' stored updates.

An unlearning's folder is never overwritten silently: the default folder
``RUN_DIR/unlearn/<request>-<mode or method>`` gets a ``-2``, ``-3``, ... suffix when it exists;
an explicit folder holding a result is refused unless forced (:func:`check_output_folder`), and
a result that records an erasure is never overwritten.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scaleflu.config import save_config
from scaleflu.fl.integrity import key_for, save_model, signer_for, state_sha256
from scaleflu.log import fmt
from scaleflu.plots import plot_rewards, plot_sensitivity, plot_sum_aoi
from scaleflu.unlearn.base import resolve_unlearn_config
from scaleflu.unlearn.receipt import changed_parts, issue_receipt, receipt_sha256, receipt_text
from scaleflu.unlearn.registry import canonical_name

log = logging.getLogger(__name__)

# the summary line's metrics: (key in the result's metrics, label); a missing one is left out
SUMMARY_METRICS = (
    ("test_acc", "test"),
    ("ra", "RA"),
    ("fa", "FA"),
    ("fa_protocol", "FA({protocol})"),
    ("backdoor_asr", "ASR"),
)
MIA_NOTE = (
    "0.5: no trace of the forgotten data, above: traces remain, below: fitted worse than unseen"
)


class OutputExistsError(ValueError):
    """An output folder already holds an unlearning's result."""


def fresh_folder(base: str | Path) -> Path:
    """``base``, or the first of ``base-2``, ``base-3``, ... that does not exist yet."""
    base = Path(base)
    n = 1
    while True:
        cand = base if n == 1 else base.with_name(f"{base.name}-{n}")
        if not cand.exists():
            return cand
        n += 1


def check_output_folder(out: str | Path, force: bool = False) -> None:
    """Refuse an explicit output folder that holds an earlier result (``force``: overwrite it),
    and always one whose result records an erasure of the history (the erasure's record)."""
    res = Path(out) / "result.json"
    if not res.is_file():
        return
    try:
        erasure = json.loads(res.read_text()).get("erasure")
    except (OSError, ValueError, AttributeError):
        erasure = None
    if erasure:
        raise OutputExistsError(
            f"{res} records an erasure of the run's history and is never overwritten; "
            "choose another --out"
        )
    if not force:
        raise OutputExistsError(
            f"{res} holds an earlier result; choose another --out, leave --out out (a new "
            "folder per request), or pass --force to overwrite it"
        )


def _mia(metrics: Mapping[str, Any]) -> tuple[str, Any]:
    """The membership audit shown in summaries: the calibrated one where it was run."""
    for key in ("mia_ref_auc", "mia_loss_auc"):
        if metrics.get(key) is not None:
            return key, metrics[key]
    return "mia_ref_auc", None


def summary_line(result: Any, command_s: float | None = None) -> str:
    """One line: every summary metric before -> after, and the times (``command_s``: the
    whole command's wall time; the method's own is ``cost.wall_s``). An unlearning measured
    nothing (``scaleflu unlearn`` without ``--evaluate``) says so instead of showing numbers."""
    times = f"method {result.cost['wall_s']:.1f} s"
    if command_s is not None:
        times += f", command {command_s:.1f} s"
    after, before = result.metrics or {}, result.original or {}
    if not after and not before:
        return f"metrics not measured (--evaluate measures them before -> after); {times}"
    parts = []
    for key, label in SUMMARY_METRICS:
        a, b = after.get(key), before.get(key)
        if a is None and b is None:
            continue
        parts.append(f"{label.format(protocol=result.protocol)} {fmt(b, 3)} -> {fmt(a, 3)}")
    key, a = _mia(after)
    b = before.get(key)
    if a is not None or b is not None:
        name = "MIA AUC" if key == "mia_ref_auc" else "MIA AUC (loss)"
        parts.append(f"{name} {fmt(b, 3)} -> {fmt(a, 3)} ({MIA_NOTE})")
    return f"{', '.join(parts)}; {times}"


def write_unlearning(
    done: Any,
    request: str,
    method: str,
    out: str | Path | None = None,
    erase: bool = False,
    plots: bool = True,
    started: float | None = None,
) -> Path:
    """Write an in-memory unlearning (``run_unlearning``'s answer) to ``out``.

    ``out`` defaults to a new folder ``RUN_DIR/unlearn/<request>-<mode or method>[-N]``.
    ``erase``: also erase the request's targets from the run's history (:func:`erase_history`),
    recorded in the result's ``erasure``, with a signed receipt when the run has a key.
    ``plots``: SCALE's figures (matplotlib is imported only for them). ``started``: the
    ``time.monotonic()`` at which the command began (its wall time goes into the summary
    line). Returns the folder.
    """
    method = canonical_name(method)
    ctx, result, unlearner, state = done.ctx, done.result, done.unlearner, done.state
    slug = ctx.request.request.slug
    tag = ctx.mode if method == "scale" else method
    out_dir = (
        Path(out) if out else fresh_folder(Path(ctx.run.run_dir) / "unlearn" / f"{slug}-{tag}")
    )
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
            plot_sensitivity(unlearner.report, out_dir / "sensitivity.png")
            # figures only where they carry information: the PPO search's returns (the default
            # mode's search runs no PPO episode) and a Sum AoI trace of more than one step
            returns = result.details.get("episode_returns") or []
            if returns:
                plot_rewards(returns, out_dir / "ppo_reward.png")
            trace = result.aoi.get("sum_s_trace") or []
            if len(trace) > 1:
                plot_sum_aoi(trace, out_dir / "sum_aoi.png")
    command_s = None if started is None else time.monotonic() - started
    log.info("%s %s: %s -> %s", result.method, request, summary_line(result, command_s), out_dir)
    return out_dir


def write_receipt(
    done: Any, method: str, erasure: dict[str, Any], out_dir: Path
) -> dict[str, Any] | None:
    """Sign the erasure receipt of an erased request with the run's key (``--keys``), keep it
    in the run's history and write ``out_dir/receipt.json``; what was written (None: the run
    has no key, so nothing can sign it)."""
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
