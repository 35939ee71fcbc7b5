"""``scaleflu unlearn``: run SCALE (or Retrain) on a trained run and write model, report, plots.

Outputs in ``--out`` (default: a new folder ``RUN_DIR/unlearn/<request>-<mode>[-N]`` per
request): ``model.safetensors`` (the unlearned global model), ``result.json`` (the
:class:`UnlearnResult` schema), ``config.yaml`` (the resolved config), for SCALE
``sensitivity.json`` and, with ``--plots``, ``sensitivity.png`` and where they carry
information ``ppo_reward.png`` (the PPO search's returns) and ``sum_aoi.png`` (a Sum AoI trace of
several steps); with ``--erase --keys`` the signed erasure receipt ``receipt.json``. An explicit
``--out`` that holds a result is refused unless ``--force``; a result that records an erasure
is never overwritten.

The command costs about what the method costs: the run is loaded once, and what is not the
method is done on request: ``--evaluate`` measures the result's metrics before -> after
(forward passes over the evaluation sets; the model before's metrics are kept in
``RUN_DIR/cache`` for the next method or request), ``--audit`` adds the expensive audits (the
calibrated MIAs' reference models, the relearn time), ``--plots`` draws SCALE's figures
(matplotlib is imported only then). Without ``--evaluate`` the summary line says that the
metrics were not measured.

A request that touches nothing the run learned (its clients took part in no round, or their
updates were erased already; an empty forget set) is refused with a warning and exit status 3
unless ``--allow-empty``: the method would run and report numbers about data the model never
saw.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any

from scaleflu.cli.args import (
    COMMAND_STARTED,
    add_config_args,
    method_arg,
    method_help,
    trust_keys,
)
from scaleflu.unlearn.registry import canonical_name, method_names

log = logging.getLogger(__name__)

METHODS = method_names()  # the one registry (scaleflu.unlearn.registry)
__all__ = ["METHODS", "add_unlearn_parser", "run_unlearn"]


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
    allow_empty: bool = False,
    force: bool = False,
    started: float | None = None,
    audit: bool = False,
    evaluate: bool = False,
    plots: bool = False,
) -> Path:
    """Unlearn ``request`` from the run in ``run_dir``; write everything to the output folder.

    The unlearning itself is :func:`scaleflu.unlearn.run.run_unlearning` (in memory).
    ``erase``: afterwards delete the request's target clients' stored updates from the run's
    history store and make the unlearned model its final model
    (:func:`scaleflu.unlearn.outputs.erase_history`); the result JSON records what was erased
    under ``erasure``, and with the run's key (``--keys``) a signed erasure receipt is written
    beside it (``receipt.json``). A request that touches nothing the run learned raises
    :class:`~scaleflu.unlearn.request.NothingToUnlearnError` before the method runs, unless
    ``allow_empty`` (then it is a warning). An ``out`` holding a result raises
    :class:`~scaleflu.unlearn.outputs.OutputExistsError` before anything runs, unless ``force``.
    ``evaluate``: measure the result's metrics; ``audit``: and the expensive audits (calibrated
    MIAs, relearn time); ``plots``: draw SCALE's figures. Without them the command costs about
    what the method costs.
    """
    # numpy, torch: imported when the command runs, not for --help
    from scaleflu.unlearn.outputs import check_output_folder, write_unlearning
    from scaleflu.unlearn.request import NothingToUnlearnError
    from scaleflu.unlearn.run import run_unlearning

    started = time.monotonic() if started is None else started
    method = canonical_name(method)
    if out is not None:
        check_output_folder(out, force)

    def refuse_empty(ctx: Any) -> None:
        why = ctx.nothing_to_forget()
        if why is None:
            return
        if not allow_empty:
            raise NothingToUnlearnError(
                f"{why}. Nothing to unlearn; nothing written (--allow-empty runs {method} anyway)"
            )
        log.warning("%s; running %s anyway (--allow-empty)", why, method)

    done = run_unlearning(
        run_dir,
        request,
        method,
        mode,
        config,
        overrides,
        progress,
        prepare=refuse_empty,
        audit=audit,
        measure=evaluate or audit,
        metrics_cache=True,
    )
    return write_unlearning(done, request, method, out, erase, plots=plots, started=started)


def _cmd_unlearn(args: argparse.Namespace) -> int:
    from scaleflu.plugins import load_plugins
    from scaleflu.unlearn.outputs import OutputExistsError
    from scaleflu.unlearn.request import NothingToUnlearnError

    load_plugins(args.plugins)  # the run's saved config names its own; these come first
    trust_keys(args.run, args.keys)
    try:
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
            allow_empty=args.allow_empty,
            force=args.force,
            started=COMMAND_STARTED,
            audit=args.audit,
            evaluate=args.evaluate,
            plots=args.plots,
        )
    except OutputExistsError as exc:
        log.error("refused: %s", exc)
        return 2
    except NothingToUnlearnError as exc:
        log.warning("%s", exc)
        return 3
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
    p.add_argument(
        "--method",
        type=method_arg,  # an alias becomes its registered name, then is checked against these
        choices=METHODS,
        default="scale",
        metavar="METHOD",
        help=method_help("unlearning method (default scale)"),
    )
    p.add_argument(
        "--out",
        default=None,
        help="output folder (default: a new RUN/unlearn/<req>-<mode>[-N] per request)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="overwrite the result in an existing --out (never one that records an erasure)",
    )
    p.add_argument(
        "--allow-empty",
        action="store_true",
        help="run even when the request touches nothing the run learned (its clients took part "
        "in no round); otherwise that is refused with exit status 3",
    )
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
        help="measure the result's metrics before -> after (test accuracy, RA, FA, ASR, MIAs; "
        "the model before's are cached in RUN/cache); without it the result has the model and "
        "its cost",
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
    # every file the command writes is closed when it returns: the process may end at once
    p.set_defaults(func=_cmd_unlearn, end_at_once=True)
