"""Command lines of the edge server and robot apps (thin: parse, build the link, run).

Options follow GNU Radio's apps: values in engineering notation (``--samp-rate 5M``,
``--freq 2.45G``, :mod:`gnuradio.eng_arg`), gr-uhd's flag names and short flags (``-a/--args``,
``-s/--samp-rate``, ``-g/--gain``, ``-f/--freq``, ``--spec``, ``-A/--antenna``), grouped
options with their defaults shown. The server has separate ``--tx-args``/``--rx-args`` (its USRP
2955 can only receive). Old spellings (``--rate``, ``--subdev``, ``--tx-subdev``,
``--rx-subdev``) are kept as hidden aliases; test-only options (``--faults``, ...) are hidden.

The options are tables (:data:`COMMON_OPTIONS`, :data:`SERVER_OPTIONS`, :data:`ROBOT_OPTIONS`):
add a row to add an option.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scaleflu.cli.args import (
    LOG_LEVELS,
    DefaultsHelpFormatter,
    add_config_args,
    method_arg,
    method_help,
    run_one_line,
)
from scaleflu.log import setup_logging

if TYPE_CHECKING:
    from scaleflu.config import Config
    from scaleflu.link import Link

# The link, protocol and config modules (numpy, yaml) are imported when an app runs, not when
# ``scaleflu --help`` registers the ``testbed`` sub-command.

log = logging.getLogger(__name__)


def app_links() -> tuple[str, ...]:
    """Link kinds an app can open (one process per node), and the old names of those."""
    from scaleflu.linkkinds import ALIASES, app_kinds

    kinds = app_kinds()
    return (*kinds, *(old for old, new in ALIASES.items() if new in kinds))


HIDDEN = argparse.SUPPRESS


def eng_float(text: str) -> float:
    """A float in engineering notation (``5M``, ``2.45G``, ``-3k``), as GNU Radio's apps take."""
    try:
        from gnuradio.eng_arg import eng_float as gr_eng_float
    except ImportError:  # GNU Radio absent (frames link only): the same suffixes, by hand
        gr_eng_float = None
    if gr_eng_float is not None:
        return float(gr_eng_float(text))
    scale = {"G": 1e9, "M": 1e6, "k": 1e3, "m": 1e-3, "u": 1e-6, "n": 1e-9}
    t = text.strip()
    try:
        if t and t[-1] in scale:
            return float(t[:-1]) * scale[t[-1]]
        return float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid engineering notation value: {text!r}") from None


# (group, flags, argparse keyword arguments). help=HIDDEN: accepted, not shown in --help.
Option = tuple[str, tuple[str, ...], dict[str, Any]]

COMMON_OPTIONS: list[Option] = [
    ("node", ("--keys",), dict(required=True, help="pre-shared key file (JSON, docs/testbed.md)")),
    (
        "link",
        ("--link",),
        dict(default=None, help="link back-end (default: testbed.link)"),
    ),
    ("link", ("--hub",), dict(default="tcp://127.0.0.1:5560", help="frames: hub address")),
    (
        "link",
        ("--broker",),
        dict(default=None, help="ofdm-shared: the shared medium's broker (tcp://host:port)"),
    ),
    ("link", ("--base-port",), dict(type=int, default=None, help="ofdm-pairs: base TCP port")),
    ("link", ("--host",), dict(default="127.0.0.1", help="ofdm-pairs: host of the peers")),
    (
        "link",
        ("--snr-db",),
        dict(type=float, default=None, help="ofdm-pairs: receive-channel SNR, dB"),
    ),
    (
        "link",
        ("--drop-rate",),
        dict(
            type=float,
            default=None,
            help="ofdm-pairs: fraction of received frames dropped (seeded)",
        ),
    ),
    (
        "link",
        ("--mcs",),
        dict(
            default=None,
            help="PHY: auto (coded OFDM, MCS adapted per link), stock (the paper's uncoded "
            "QPSK) or an MCS name (bpsk-1/2 .. 64qam-3/4); default: testbed.mcs",
        ),
    ),
    ("uhd", ("-f", "--freq"), dict(type=eng_float, default=2.45e9, help="centre frequency, Hz")),
    (
        "uhd",
        ("-s", "--samp-rate"),
        dict(dest="samp_rate", type=eng_float, default=5e6, help="sample rate, S/s"),
    ),
    ("uhd", ("--rate",), dict(dest="samp_rate", type=eng_float, default=HIDDEN, help=HIDDEN)),
    (
        "uhd",
        ("-g", "--gain"),
        dict(type=float, default=None, help="TX and RX gain, dB (default: --tx-gain / --rx-gain)"),
    ),
    ("uhd", ("--tx-gain",), dict(type=float, default=60.0, help="TX gain, dB")),
    ("uhd", ("--rx-gain",), dict(type=float, default=30.0, help="RX gain, dB")),
    (
        "uhd",
        ("--spec",),
        dict(dest="spec", default="", help="subdevice spec of both radios (e.g. A:0)"),
    ),
    ("uhd", ("--subdev",), dict(dest="spec", default=HIDDEN, help=HIDDEN)),
    (
        "uhd",
        ("--tx-spec",),
        dict(dest="tx_spec", default=None, help="TX subdevice spec (default: --spec)"),
    ),
    ("uhd", ("--tx-subdev",), dict(dest="tx_spec", default=HIDDEN, help=HIDDEN)),
    (
        "uhd",
        ("--rx-spec",),
        dict(dest="rx_spec", default=None, help="RX subdevice spec (default: --spec)"),
    ),
    ("uhd", ("--rx-subdev",), dict(dest="rx_spec", default=HIDDEN, help=HIDDEN)),
    ("uhd", ("-A", "--antenna"), dict(default="RX2", help="RX antenna")),
    ("uhd", ("--tx-antenna",), dict(default="TX/RX", help="TX antenna")),
    ("uhd", ("--clock-source",), dict(default="", help="internal | external | gpsdo")),
    ("uhd", ("--time-source",), dict(default="", help="internal | external | gpsdo")),
    ("uhd", ("--lo-offset",), dict(type=eng_float, default=0.0, help="LO offset, Hz")),
    (
        "logging",
        ("--log-level",),
        dict(
            type=str.upper, choices=LOG_LEVELS, default=None, help="default INFO (or SCALEFLU_LOG)"
        ),
    ),
    ("logging", ("--log-file",), dict(default=None, help="also log to this file")),
]

SERVER_OPTIONS: list[Option] = [
    ("node", ("--run-dir",), dict(required=True, help="run folder (history, report); resumes it")),
    (
        "uhd",
        ("-a", "--args"),
        dict(
            dest="dev_args",
            default=None,
            help="device args of both radios (overrides --tx-args/--rx-args)",
        ),
    ),
    (
        "uhd",
        ("--tx-args",),
        dict(
            default="type=b200,master_clock_rate=20e6",
            help="transmitting radio (the 2955 cannot transmit)",
        ),
    ),
    (
        "uhd",
        ("--rx-args",),
        dict(
            default="type=x300,master_clock_rate=200e6",
            help="receiving radio (USRP 2955 / X310 + TwinRX)",
        ),
    ),
    ("output", ("--no-progress",), dict(action="store_true", help="hide progress bars")),
    ("output", ("--no-plots",), dict(action="store_true", help="write no PNG figures")),
]

ROBOT_OPTIONS: list[Option] = [
    (
        "node",
        ("--robot-id",),
        dict(
            type=int, required=True, help="this robot's id, 1..N (its FL client id is robot id - 1)"
        ),
    ),
    (
        "uhd",
        ("-a", "--args"),
        dict(
            dest="dev_args",
            default="type=b200,master_clock_rate=20e6",
            help="the robot's USRP 2900 (B200), used for TX and RX",
        ),
    ),
    (
        "unlearning",
        ("--unlearn",),
        dict(
            choices=("client", "class", "sample"),
            default=None,
            help="ask the server to forget this robot's data / a class / samples",
        ),
    ),
    (
        "unlearning",
        ("--unlearn-classes",),
        dict(default="", help="class request: comma-separated ids"),
    ),
    (
        "unlearning",
        ("--unlearn-fraction",),
        dict(type=float, default=None, help="sample request: 0..1"),
    ),
    (
        "unlearning",
        ("--unlearn-after-round",),
        dict(type=int, default=1, help="send the request after uploading this round's update"),
    ),
    ("node", ("--max-runtime",), dict(type=float, default=None, help="give up after this long, s")),
    ("node", ("--summary",), dict(default=None, help="write the robot's summary JSON here")),
    (
        "unlearning",
        ("--receipts",),
        dict(
            default=None,
            metavar="DIR",
            help="keep the server's erasure receipts here (checked on arrival; "
            "`scaleflu receipt verify FILE --key ENROLMENT` checks one again)",
        ),
    ),
    # test-only: misbehave on purpose (nan,shape,duplicate,replay,forged,garbage,crash)
    ("testing", ("--faults",), dict(default="", help=HIDDEN)),
    ("testing", ("--fault-round",), dict(type=int, default=1, help=HIDDEN)),
]

GROUP_TITLES = {
    "config": "configuration",
    "node": "node",
    "link": "link",
    "uhd": "radio (--link uhd)",
    "unlearning": "unlearning request",
    "output": "output",
    "logging": "logging",
    "testing": "testing (hidden)",
}


def build_app_parser(prog: str, description: str, *tables: list[Option]) -> argparse.ArgumentParser:
    """An app's parser from option tables, grouped, with defaults shown."""
    p = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=DefaultsHelpFormatter
    )
    groups: dict[str, Any] = {"config": p.add_argument_group(GROUP_TITLES["config"])}
    add_config_args(groups["config"], example="testbed.rounds=3")  # the same --config/--set
    for table in tables:
        for group, flags, kwargs in table:
            if flags == ("--link",):
                kwargs = {**kwargs, "choices": app_links()}
            if group not in groups:
                groups[group] = p.add_argument_group(GROUP_TITLES.get(group, group))
            groups[group].add_argument(*flags, **kwargs)
    return p


def add_common_args(p: argparse.ArgumentParser) -> None:
    """Config, keys, link and radio options shared by both apps (ungrouped; kept for callers)."""
    add_config_args(p)
    for _, flags, kwargs in COMMON_OPTIONS:
        if flags == ("--link",):
            kwargs = {**kwargs, "choices": app_links()}
        p.add_argument(*flags, **kwargs)


def setup_app_logging(args: argparse.Namespace) -> None:
    """Console logging, plus a file when asked."""
    setup_logging(args.log_level)
    if args.log_file:
        Path(args.log_file).parent.mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(args.log_file)
        fh.setFormatter(logging.getLogger().handlers[0].formatter)
        logging.getLogger().addHandler(fh)


def build_link(
    args: argparse.Namespace,
    cfg: Config,
    node_id: int,
    peers: Sequence[int],
    tx_args: str | None,
    rx_args: str | None,
) -> Link:
    """The node's Link from the command line and the ``testbed`` config section."""
    from scaleflu.link.mcs import STOCK, mcs_name
    from scaleflu.linkkinds import canonical_kind, open_link
    from scaleflu.testbed.protocol import SERVER_ID

    kind = canonical_kind(args.link or str(cfg.testbed.link))
    mcs = mcs_name(getattr(args, "mcs", None) or cfg.testbed.mcs)  # a bad name: one line
    opts: dict[str, Any] = {}
    if kind in ("frames", "frames-shared"):
        opts["hub"] = args.hub
    if kind in ("ofdm-shared", "ofdm-pairs", "uhd"):
        opts["mcs"] = mcs  # the PHY (and with a MAC, the MCS it chooses)
    if kind == "frames-shared":
        opts.update(
            # the hub's frame-level PHY model times and loses frames by the MAC's MCS
            mac={**dict(cfg.testbed.mac), "mcs": None if mcs == STOCK else mcs},
            members=tuple(peers) if node_id == SERVER_ID else (),
            rate_bytes_per_s=cfg.testbed.channel.rate_bytes_per_s,
            seed=int(cfg.seed) + node_id,
        )
    elif kind in ("ofdm-shared", "uhd"):  # one frequency: the server-scheduled MAC
        opts.update(
            mac=dict(cfg.testbed.mac),
            # an enrolled robot (it holds a key file) is a member from the start: no JOIN in
            # contention, so every transmission on the frequency is scheduled
            members=tuple(peers) if node_id == SERVER_ID else (node_id,),
            seed=int(cfg.seed) + node_id,
        )
        if kind == "ofdm-shared":
            from scaleflu.radio.medium import DEFAULT_MEDIUM_ADDRESS

            opts["broker"] = args.broker or DEFAULT_MEDIUM_ADDRESS
            if getattr(args, "max_runtime", None):  # a robot waits this long for its broker
                opts["timeout"] = float(args.max_runtime)
    if kind == "ofdm-pairs":
        opts.update(
            peers={p: args.host for p in peers},
            base_port=args.base_port,
            snr_db=args.snr_db,
            drop_rate=args.drop_rate,
            seed=int(cfg.seed) + node_id,
        )
    if kind == "uhd":
        opts.update(
            tx_args=tx_args,
            rx_args=rx_args,
            freq=args.freq,
            samp_rate=args.samp_rate,
            tx_gain=args.gain if args.gain is not None else args.tx_gain,
            rx_gain=args.gain if args.gain is not None else args.rx_gain,
            tx_antenna=args.tx_antenna,
            rx_antenna=args.antenna,
            tx_subdev=args.tx_spec if args.tx_spec is not None else args.spec,
            rx_subdev=args.rx_spec if args.rx_spec is not None else args.spec,
            clock_source=args.clock_source,
            time_source=args.time_source or None,
            lo_offset=args.lo_offset,
        )
    arq = {k: v for k, v in cfg.testbed.arq.items() if v is not None}
    if node_id != SERVER_ID:  # robots: reassembly bounds that fit a 4 GB board (docs/link.md §6)
        robot = cfg.testbed.robot_arq
        arq = {**{k: v for k, v in robot.items() if v is not None}, **arq}
    if arq:
        opts["arq"] = arq
    log.info("node %d: %s link", node_id, kind)
    return open_link(kind, node_id, **{k: v for k, v in opts.items() if v is not None})


def storage_fault(exc: BaseException) -> BaseException | None:
    """The local storage fault behind ``exc`` (disk full, read-only folder, I/O error), or None.

    OSError and sqlite3 errors are such faults; safetensors (its Rust writer) and torch's zip
    writer report an OS error as their own exception types, with the OS error in the text. The
    exception's causes are searched too (a fault wrapped by the code that met it).
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (OSError, sqlite3.Error)):
            return e
        text = str(e)
        if type(e).__name__ == "SafetensorError" and ("I/O error" in text or "os error" in text):
            return e
        if isinstance(e, RuntimeError) and ("PytorchStreamWriter" in text or "No space" in text):
            return e
        e = e.__cause__ or e.__context__
    return None


def install_sigterm() -> None:
    """Turn SIGTERM into KeyboardInterrupt so the apps close their links on the way out."""

    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)


def server_main(argv: Sequence[str] | None = None) -> int:
    """``apps/edge_server.py``."""
    p = build_app_parser(
        "edge_server.py",
        "SCALE testbed edge server: FL rounds over the link, unlearning, report.",
        COMMON_OPTIONS,
        SERVER_OPTIONS,
    )
    args = p.parse_args(argv)
    setup_app_logging(args)
    install_sigterm()
    return run_one_line(_run_server, args, logger=log)


def _run_server(args: argparse.Namespace) -> int:
    from scaleflu.config import load_config
    from scaleflu.testbed.protocol import SERVER_ID
    from scaleflu.testbed.report import print_summary, write_report
    from scaleflu.testbed.server import EdgeServer

    cfg = load_config(args.config, args.overrides, args.plugins)
    from scaleflu.testbed.keys import KeyStore

    try:  # the server store: robots' keys (allow-list) and the server's signing identity
        store = KeyStore.load(args.keys)
    except FileNotFoundError:
        log.error("key file not found: %s", args.keys)
        return 2
    except (OSError, ValueError) as exc:
        log.error("cannot use the key store: %s", exc)
        return 2
    keys = store.robots
    tx_args = args.dev_args if args.dev_args is not None else args.tx_args
    rx_args = args.dev_args if args.dev_args is not None else args.rx_args
    try:
        link = build_link(args, cfg, SERVER_ID, sorted(keys), tx_args, rx_args)
    except Exception as exc:  # no radio, port in use, ...: one line, not a traceback
        log.error("cannot open the link: %s", exc)
        return 2
    from scaleflu.fl.integrity import heads_path

    try:
        server = EdgeServer(
            link,
            keys,
            cfg,
            args.run_dir,
            progress=not args.no_progress,
            signing_key=store.signing_key,
            heads=heads_path(args.keys),  # the history's signed versions, beside the key store
        )
        report = server.run()
        out = write_report(report, args.run_dir, plots=not args.no_plots)
        print_summary(report, sys.stdout)
        log.info("report written to %s", out)
    except KeyboardInterrupt:
        log.warning("interrupted; the history store keeps every completed round")
        return 130
    except Exception as exc:
        from scaleflu.fl.integrity import IntegrityError

        if isinstance(exc, IntegrityError):
            log.error("edge server refuses the run folder: %s", exc)
            return 2
        fault = storage_fault(exc)  # disk full, read-only folder: a local fault, status 3
        if fault is None:
            raise
        log.error(
            "edge server stopped: %s (%s); the history store keeps every completed round: "
            "free space / fix the folder and start it again with the same --run-dir",
            getattr(fault, "strerror", None) or fault,
            getattr(fault, "filename", None) or args.run_dir,
        )
        return 3
    finally:
        link.close()
    return 0


def robot_main(argv: Sequence[str] | None = None) -> int:
    """``apps/robot_client.py``."""
    p = build_app_parser(
        "robot_client.py",
        "SCALE testbed robot: trains on its own data, reports RA/FA of models.",
        COMMON_OPTIONS,
        ROBOT_OPTIONS,
    )
    args = p.parse_args(argv)
    setup_app_logging(args)
    install_sigterm()
    return run_one_line(_run_robot, args, p, logger=log)


def _run_robot(args: argparse.Namespace, p: argparse.ArgumentParser) -> int:
    from scaleflu.config import load_config
    from scaleflu.testbed.protocol import SERVER_ID
    from scaleflu.testbed.robot import RobotClient

    cfg = load_config(args.config, args.overrides, args.plugins)
    from scaleflu.testbed.keys import Enrolment

    try:  # this robot's enrolment file: its own key and the server's public key
        enrol = Enrolment.load(args.keys, args.robot_id)
    except FileNotFoundError:
        log.error("key file not found: %s", args.keys)
        return 2
    except (OSError, ValueError) as exc:
        log.error("cannot use the enrolment file: %s", exc)
        return 2
    unlearn = None
    if args.unlearn:
        unlearn = {"kind": args.unlearn}
        if args.unlearn == "class":
            unlearn["classes"] = [int(c) for c in args.unlearn_classes.split(",") if c]
        if args.unlearn == "sample":
            unlearn["fraction"] = args.unlearn_fraction
    started = time.monotonic()
    try:
        link = build_link(args, cfg, args.robot_id, [SERVER_ID], args.dev_args, args.dev_args)
    except Exception as exc:  # no radio, port in use, no broker, ...: one line, not a traceback
        log.error("cannot open the link: %s", exc)
        return 2

    summary: dict[str, Any] = {}
    try:
        robot = RobotClient(
            link,
            args.robot_id,
            enrol.key,
            cfg,
            unlearn,
            args.unlearn_after_round,
            tuple(f for f in args.faults.split(",") if f),
            args.fault_round,
            server_public_key=enrol.server_public_key,
            receipts_dir=args.receipts,
        )
        left = None  # --max-runtime bounds the whole process, the link's opening included
        if args.max_runtime is not None:
            left = max(0.0, args.max_runtime - (time.monotonic() - started))
        summary = robot.run(left)
        if robot.refused:  # logged once, as the reason (e.g. another MCS table version)
            return 2
    except KeyboardInterrupt:
        log.warning("robot %d interrupted", args.robot_id)
        return 130
    finally:
        link.close()
        if args.summary and summary:
            Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
            Path(args.summary).write_text(json.dumps(summary, indent=1, default=str))
    return 0


def add_testbed_parser(subparsers: Any) -> None:
    """Register ``scaleflu testbed``: the local testbed (what ``apps/testbed.py`` runs).

    The options are the launcher's own (``scaleflu testbed --help`` prints them); they are
    handed over as they are, so the launcher is imported only when the testbed runs.
    """
    p = subparsers.add_parser(
        "testbed",
        help="run the local testbed: edge server + robots over a simulated channel (make demo)",
        description="Same options as apps/testbed.py; see `scaleflu testbed --help`.",
        add_help=False,
        prefix_chars="\0",  # every argument goes to the launcher, --help included
    )
    p.add_argument("launcher_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_testbed)


def _cmd_testbed(args: argparse.Namespace) -> int:
    argv = list(args.launcher_args)
    level = getattr(args, "log_level", None)
    if level and "--log-level" not in argv:
        argv = ["--log-level", level, *argv]
    return launcher_main(argv, prog="scaleflu testbed")


# ----------------------------------------------------------------------------- the local testbed


def launcher_kinds() -> tuple[str, ...]:
    """Link kinds the local testbed runs: every kind whose nodes are processes, but real radios."""
    from scaleflu.linkkinds import app_kinds

    return tuple(k for k in app_kinds() if k != "uhd")


LAUNCHER_DESCRIPTION = (
    "Local SCALE testbed: edge server + robots as processes over a simulated channel, FL "
    "rounds on FashionMNIST, one robot asks to be forgotten, report."
)


def add_launcher_args(p: argparse.ArgumentParser) -> None:
    """The testbed's options (``apps/testbed.py`` and ``scaleflu testbed``)."""
    from scaleflu.linkkinds import ALIASES
    from scaleflu.unlearn.registry import method_names

    kinds = launcher_kinds()
    p.add_argument("--robots", type=int, default=3, help="robot processes")
    p.add_argument("--rounds", type=int, default=3, help="FL rounds")
    p.add_argument(
        "--link",
        choices=(*kinds, *(old for old, new in ALIASES.items() if new in kinds)),
        default="ofdm-shared",
        help="ofdm-shared (default): every node on one simulated frequency at sample level "
        "(OFDM/QPSK PHY in every process, a fading channel, bursts that overlap collide) with "
        "the server-scheduled MAC and the broadcast downlink; frames-shared: the same at frame "
        "level, no PHY (cheaper); frames: ideal frame hub (no collisions); ofdm-pairs: OFDM over "
        "ZeroMQ, a private channel per pair (ideal FDMA)",
    )
    p.add_argument(
        "--mcs",
        default=None,
        help="PHY of the radio links: auto (coded OFDM, the MAC chooses each robot's MCS from "
        "the SNRs both ends measure), stock (the paper's uncoded QPSK) or an MCS name; "
        "frames-shared: the hub's frame-level PHY model (default: testbed.mcs)",
    )
    p.add_argument(
        "--fading",
        choices=("rician", "rayleigh", "none"),
        default=None,
        help="ofdm-shared, frames-shared: fading of every link (default: testbed.medium.fading)",
    )
    p.add_argument(
        "--method",
        type=method_arg,  # the unlearning-method registry: its names and aliases
        choices=method_names(),
        default=None,
        metavar="METHOD",
        help=method_help("unlearning method (default: testbed.unlearn.method)"),
    )
    p.add_argument(
        "--backdoor-robot",
        type=int,
        default=None,
        help="robot whose data carries the trigger and who asks to be forgotten "
        "(default: the one with the most data)",
    )
    p.add_argument("--unlearn", choices=("client", "class", "sample", "none"), default="client")
    p.add_argument(
        "--unlearn-after-round",
        type=int,
        default=None,
        help="the requesting robot asks after this round (default: the last)",
    )
    p.add_argument("--loss", type=float, default=None, help="frames link: frame loss")
    p.add_argument(
        "--snr-db",
        type=float,
        default=None,
        help="ofdm-shared: mean SNR of every link (default: testbed.medium.snr_db); "
        "ofdm-pairs: receive SNR (default 20), dB",
    )
    p.add_argument("--drop-rate", type=float, default=0.02, help="ofdm-pairs: frame drop rate")
    p.add_argument(
        "--kill-robot",
        type=int,
        default=None,
        help="this robot dies on receiving the model of --kill-round, then rejoins",
    )
    p.add_argument("--kill-round", type=int, default=2, help="round of --kill-robot's death")
    p.add_argument(
        "--attacker-robot",
        type=int,
        default=None,
        help="this robot also sends NaN, wrong-shape, duplicate, replayed, forged "
        "and garbage uploads in round 1",
    )
    p.add_argument(
        "--outsider-rate",
        type=float,
        default=0.0,
        help="frames link: a keyless outsider process floods the hub with this many frames/s "
        "(keyless partial messages, forged robot/server DATA, ACK and NACK, garbage; "
        "scaleflu.testbed.outsider)",
    )
    p.add_argument(
        "--restart-server-after-round",
        type=int,
        default=None,
        help="kill -9 the server once this round is recorded, then restart it",
    )
    p.add_argument("--out", default=None, help="run folder (default runs/testbed-<time>)")
    add_config_args(p, example="testbed.rounds=2")
    p.add_argument("--timeout", type=float, default=1800.0, help="give up after this long, s")
    p.add_argument("--quiet", action="store_true", help="do not echo progress lines")


def launcher_main(argv: Sequence[str] | None = None, prog: str = "testbed.py") -> int:
    """``apps/testbed.py`` and ``scaleflu testbed``: run the local testbed end to end."""
    from scaleflu.testbed.launcher import run_testbed

    p = argparse.ArgumentParser(
        prog=prog,
        description=LAUNCHER_DESCRIPTION,
        formatter_class=DefaultsHelpFormatter,
    )
    add_launcher_args(p)
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=None,
        help="the launcher's own messages (default WARNING or SCALEFLU_LOG)",
    )
    args = p.parse_args(argv)
    setup_logging(args.log_level or os.environ.get("SCALEFLU_LOG", "WARNING"))
    return run_one_line(run_testbed, args, logger=log)


if __name__ == "__main__":  # python -m scaleflu.cli.testbed edge_server|robot_client ...
    _apps = {"edge_server": server_main, "robot_client": robot_main}
    if len(sys.argv) < 2 or sys.argv[1] not in _apps:
        sys.stderr.write("usage: python -m scaleflu.cli.testbed edge_server|robot_client ...\n")
        sys.exit(2)
    sys.exit(_apps[sys.argv[1]](sys.argv[2:]))
