"""``scaleflu unlearn``: run SCALE (or Retrain) on a trained run and write model, report, plots.

Outputs in ``--out`` (default ``RUN_DIR/unlearn/<request>-<mode>``): ``model.safetensors`` (the
unlearned global model), ``result.json`` (the :class:`UnlearnResult` schema), ``config.yaml``
(the resolved config), and for SCALE ``sensitivity.json``, ``sensitivity.png``,
``ppo_reward.png`` and ``sum_aoi.png``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from scaleflu.cliargs import add_config_args
from scaleflu.unlearn.registry import canonical_name, method_names, run_unlearning

log = logging.getLogger(__name__)

METHODS = method_names()  # the one registry (scaleflu.unlearn.registry)


def run_unlearn(
    run_dir: str | Path,
    request: str,
    mode: str | None = None,
    method: str = "scale",
    out: str | Path | None = None,
    config: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    progress: bool = True,
    erase: bool = False,
) -> Path:
    """Unlearn ``request`` from the run in ``run_dir``; write everything to the output folder.

    The unlearning itself is :func:`scaleflu.unlearn.registry.run_unlearning` (in memory).
    ``erase``: afterwards delete the request's target clients' stored updates from the run's
    history store and make the unlearned model its final model (:func:`erase_history`); the
    result JSON records what was erased under ``erasure``.
    """
    from scaleflu.config import save_config
    from scaleflu.fl.integrity import key_for, save_model
    from scaleflu.log import fmt
    from scaleflu.plots import plot_rewards, plot_sensitivity, plot_sum_aoi
    from scaleflu.unlearn.base import resolve_unlearn_config

    method = canonical_name(method)
    done = run_unlearning(run_dir, request, method, mode, config, overrides, progress)
    ctx, result, unlearner, state = done.ctx, done.result, done.unlearner, done.state
    slug = ctx.request.request.slug
    tag = ctx.mode if method == "scale" else method
    out_dir = Path(out) if out else Path(run_dir) / "unlearn" / f"{slug}-{tag}"
    out_dir.mkdir(parents=True, exist_ok=True)
    save_config(resolve_unlearn_config(ctx.cfg), out_dir / "config.yaml")
    model_path = out_dir / "model.safetensors"
    # with its digest under the run's key when it is trusted (--keys), wherever --out is
    save_model(state, model_path, key_for(run_dir))
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


def trust_keys(run_dir: str | Path, keys: str | Path | None) -> None:
    """``--keys FILE``: check (and write) the run's authenticated digests under its key."""
    if keys is None:
        return
    from scaleflu.fl.integrity import trust
    from scaleflu.testbed.keys import load_integrity_key

    trust(run_dir, load_integrity_key(keys))


def _cmd_unlearn(args: argparse.Namespace) -> int:
    trust_keys(args.run, args.keys)
    run_unlearn(
        args.run,
        args.request,
        args.mode,
        args.method,
        args.out,
        args.config,
        args.overrides,
        progress=not args.no_progress,
        erase=args.erase,
    )
    return 0


def add_unlearn_parser(subparsers: Any) -> None:
    """Register ``unlearn`` on the main CLI's sub-parsers."""
    p = subparsers.add_parser(
        "unlearn",
        help="unlearn a client, class or samples from a trained run (SCALE or a baseline)",
        description=(
            "Unlearn from RUN_DIR. Requests: client:7 | client:3,7 | class:3 (whole "
            "federation) | class:3@7 (client 7 only) | sample:7:0.1 (client 7's poisoned "
            "samples first). --config/--set change scale.* and baselines.* only."
        ),
    )
    p.add_argument("--run", required=True, help="run directory written by `scaleflu train`")
    p.add_argument("--request", required=True, help="client:N[,N] | class:C[@N] | sample:N:F")
    p.add_argument("--mode", choices=("paper", "default"), default=None, help="default: scale.mode")
    p.add_argument("--method", choices=METHODS, default="scale")
    p.add_argument("--out", default=None, help="output folder (default RUN/unlearn/<req>-<mode>)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    p.add_argument(
        "--erase",
        action="store_true",
        help="afterwards delete the targets' stored updates from RUN's history and make the "
        "unlearned model its final model (what a serving server does)",
    )
    p.add_argument(
        "--keys",
        default=None,
        metavar="FILE",
        help="key file (the testbed server's keys.json, or `scaleflu keys integrity`): refuse "
        "a run whose history or model fails its authenticated digest; sign the output model",
    )
    add_config_args(p, example="scale.ppo.episodes=50")
    p.set_defaults(func=_cmd_unlearn)
