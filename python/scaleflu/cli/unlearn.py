"""``scaleflu unlearn``: run SCALE (or Retrain) on a trained run and write model, report, plots.

Outputs in ``--out`` (default ``RUN_DIR/unlearn/<request>-<mode>``): ``model.safetensors`` (the
unlearned global model), ``result.json`` (the :class:`UnlearnResult` schema), ``config.yaml``
(the resolved config), for SCALE ``sensitivity.json`` and, with ``--plots``,
``sensitivity.png``, ``ppo_reward.png`` and ``sum_aoi.png``; with ``--erase --keys`` the signed
erasure receipt ``receipt.json``.

The command costs about what the method costs: the run is loaded once, and what is not the
method is done on request: ``--evaluate`` measures the result's metrics (forward passes over
the evaluation sets; the model before's metrics are kept in ``RUN_DIR/cache`` for the next
method or request), ``--audit`` adds the expensive audits (the calibrated MIAs' reference
models, the relearn time), ``--plots`` draws SCALE's figures (matplotlib is imported only then).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from scaleflu.cli.args import add_config_args, trust_keys
from scaleflu.unlearn.outputs import erase_history, write_unlearning
from scaleflu.unlearn.registry import canonical_name, method_names, run_unlearning

log = logging.getLogger(__name__)

METHODS = method_names()  # the one registry (scaleflu.unlearn.registry)
__all__ = ["METHODS", "add_unlearn_parser", "erase_history", "run_unlearn"]


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
    audit: bool = False,
    evaluate: bool = False,
    plots: bool = False,
) -> Path:
    """Unlearn ``request`` from the run in ``run_dir``; write everything to the output folder.

    The unlearning itself is :func:`scaleflu.unlearn.registry.run_unlearning` (in memory).
    ``erase``: afterwards delete the request's target clients' stored updates from the run's
    history store and make the unlearned model its final model (:func:`erase_history`); the
    result JSON records what was erased under ``erasure``, and with the run's key (``--keys``)
    a signed erasure receipt is written beside it (``receipt.json``). ``evaluate``: measure the
    result's metrics; ``audit``: and the expensive audits (calibrated MIAs, relearn time);
    ``plots``: draw SCALE's figures. Without them the command costs about what the method costs.
    """
    method = canonical_name(method)
    done = run_unlearning(
        run_dir,
        request,
        method,
        mode,
        config,
        overrides,
        progress,
        audit=audit,
        measure=evaluate or audit,
        metrics_cache=True,
    )
    return write_unlearning(done, request, method, out, erase, plots=plots)


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
        audit=args.audit,
        evaluate=args.evaluate,
        plots=args.plots,
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
        "unlearned model its final model (what a serving server does); with --keys, also a "
        "signed erasure receipt (receipt.json)",
    )
    p.add_argument(
        "--evaluate",
        action="store_true",
        help="measure the result's metrics (test accuracy, RA, FA, ASR, MIAs; the model "
        "before's are cached in RUN/cache); without it the result has the model and its cost",
    )
    p.add_argument(
        "--audit",
        action="store_true",
        help="--evaluate and the expensive audits too (the calibrated MIAs' reference models, "
        "the relearn time), as Table II measures",
    )
    p.add_argument(
        "--plots", action="store_true", help="draw SCALE's figures (sensitivity, PPO, Sum AoI)"
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
