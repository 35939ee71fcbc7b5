"""Command lines of the edge server and robot apps (thin: parse, build the link, run).

Radio options follow gr-dvbs2rx's apps: device args (separate ``--tx-args``/``--rx-args`` at
the server, whose USRP 2955 can only receive), ``--freq``, ``--tx-gain``, ``--rx-gain``,
``--rate``, ``--subdev``, ``--clock-source``, ``--time-source``, ``--lo-offset``.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scaleflu.cli import add_config_args
from scaleflu.config import load_config
from scaleflu.link import Link
from scaleflu.log import setup_logging
from scaleflu.testbed.protocol import SERVER_ID
from scaleflu.testbed.transport import LINK_KINDS, make_testbed_link

log = logging.getLogger(__name__)

APP_LINKS = tuple(k for k in LINK_KINDS if k != "ofdm-loopback")  # one process per node


def add_common_args(p: argparse.ArgumentParser) -> None:
    """Config, keys, link and radio options shared by both apps."""
    add_config_args(p)  # the same --config (at every node) and --set as every command
    p.add_argument("--keys", required=True, help="pre-shared key file (JSON, see docs/testbed.md)")
    p.add_argument(
        "--link", choices=APP_LINKS, default=None, help="link back-end (default: testbed.link)"
    )
    p.add_argument("--hub", default="tcp://127.0.0.1:5560", help="frames link: hub address")
    p.add_argument("--base-port", type=int, default=None, help="ofdm-zmq: base TCP port")
    p.add_argument("--host", default="127.0.0.1", help="ofdm-zmq: host of the peers")
    p.add_argument("--snr-db", type=float, default=None, help="ofdm-zmq: receive-channel SNR")
    p.add_argument(
        "--drop-rate",
        type=float,
        default=None,
        help="ofdm-zmq: fraction of received frames dropped (seeded)",
    )
    p.add_argument("--freq", type=float, default=2.45e9, help="uhd: centre frequency, Hz")
    p.add_argument("--rate", type=float, default=5e6, help="uhd: sample rate, S/s")
    p.add_argument("--tx-gain", type=float, default=60.0, help="uhd: TX gain, dB")
    p.add_argument("--rx-gain", type=float, default=30.0, help="uhd: RX gain, dB")
    p.add_argument("--subdev", default="", help="uhd: subdevice spec of both radios (e.g. A:0)")
    p.add_argument("--tx-subdev", default=None, help="uhd: TX subdevice (overrides --subdev)")
    p.add_argument("--rx-subdev", default=None, help="uhd: RX subdevice (overrides --subdev)")
    p.add_argument("--clock-source", default="", help="uhd: internal | external | gpsdo")
    p.add_argument("--time-source", default="", help="uhd: internal | external | gpsdo")
    p.add_argument("--lo-offset", type=float, default=0.0, help="uhd: LO offset, Hz")
    p.add_argument("--log-level", default=None, help="DEBUG | INFO | WARNING")
    p.add_argument("--log-file", default=None, help="also log to this file")


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
    cfg: dict[str, Any],
    node_id: int,
    peers: Sequence[int],
    tx_args: str | None,
    rx_args: str | None,
) -> Link:
    """The node's Link from the command line and the ``testbed`` config section."""
    kind = args.link or str(cfg["testbed"]["link"])
    opts: dict[str, Any] = {}
    if kind == "frames":
        opts["hub"] = args.hub
    elif kind == "ofdm-zmq":
        opts.update(
            peers={p: args.host for p in peers},
            base_port=args.base_port,
            snr_db=args.snr_db,
            drop_rate=args.drop_rate,
            seed=int(cfg["seed"]) + node_id,
        )
    elif kind == "uhd":
        opts.update(
            tx_args=tx_args,
            rx_args=rx_args,
            freq=args.freq,
            samp_rate=args.rate,
            tx_gain=args.tx_gain,
            rx_gain=args.rx_gain,
            tx_subdev=args.tx_subdev if args.tx_subdev is not None else args.subdev,
            rx_subdev=args.rx_subdev if args.rx_subdev is not None else args.subdev,
            clock_source=args.clock_source,
            time_source=args.time_source or None,
            lo_offset=args.lo_offset,
        )
    arq = {k: v for k, v in (cfg["testbed"].get("arq") or {}).items() if v is not None}
    if arq:
        opts["arq"] = arq
    log.info("node %d: %s link", node_id, kind)
    return make_testbed_link(kind, node_id, **opts)


def install_sigterm() -> None:
    """Turn SIGTERM into KeyboardInterrupt so the apps close their links on the way out."""

    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)


def server_main(argv: Sequence[str] | None = None) -> int:
    """``apps/edge_server.py``."""
    p = argparse.ArgumentParser(
        prog="edge_server.py",
        description="SCALE testbed edge server: FL rounds over the link, unlearning, report.",
    )
    add_common_args(p)
    p.add_argument("--run-dir", required=True, help="run folder (history, report); resumes it")
    p.add_argument(
        "--tx-args",
        default="type=b200,master_clock_rate=20e6",
        help="uhd: transmitting radio (the 2955 cannot transmit)",
    )
    p.add_argument(
        "--rx-args",
        default="type=x300,master_clock_rate=200e6",
        help="uhd: receiving radio (USRP 2955 / X310 + TwinRX)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    setup_app_logging(args)
    install_sigterm()
    from scaleflu.testbed.report import print_summary, write_report
    from scaleflu.testbed.server import EdgeServer

    cfg = load_config(args.config, args.overrides)
    from scaleflu.testbed.keys import KeyStore

    try:  # the server store: robots' keys (allow-list) and the server's signing identity
        store = KeyStore.load(args.keys)
    except (OSError, ValueError) as exc:
        log.error("cannot use the key store: %s", exc)
        return 2
    keys = store.robots
    try:
        link = build_link(args, cfg, SERVER_ID, sorted(keys), args.tx_args, args.rx_args)
    except Exception as exc:  # no radio, port in use, ...: one line, not a traceback
        log.error("cannot open the link: %s", exc)
        return 2
    try:
        server = EdgeServer(
            link,
            keys,
            cfg,
            args.run_dir,
            progress=not args.no_progress,
            signing_key=store.signing_key,
        )
        report = server.run()
        out = write_report(report, args.run_dir, plots=not args.no_plots)
        print_summary(report, sys.stdout)
        log.info("report written to %s", out)
    except KeyboardInterrupt:
        log.warning("interrupted; the history store keeps every completed round")
        return 130
    except RuntimeError as exc:
        from scaleflu.fl.history import HistoryIntegrityError

        if not isinstance(exc, HistoryIntegrityError):
            raise
        log.error("edge server refuses the run folder: %s", exc)
        return 2
    except (OSError, sqlite3.Error) as exc:  # disk full, read-only folder: a local fault
        log.error(
            "edge server stopped: %s (%s); the history store keeps every completed round: "
            "free space / fix the folder and start it again with the same --run-dir",
            getattr(exc, "strerror", None) or exc,
            getattr(exc, "filename", None) or args.run_dir,
        )
        return 3
    finally:
        link.close()
    return 0


def robot_main(argv: Sequence[str] | None = None) -> int:
    """``apps/robot_client.py``."""
    p = argparse.ArgumentParser(
        prog="robot_client.py",
        description="SCALE testbed robot: trains on its own data, reports RA/FA of models.",
    )
    add_common_args(p)
    p.add_argument("--robot-id", type=int, required=True, help="1..N (FL client id - 1)")
    p.add_argument(
        "--args",
        dest="dev_args",
        default="type=b200,master_clock_rate=20e6",
        help="uhd: the robot's USRP 2900 (B200), used for TX and RX",
    )
    p.add_argument(
        "--unlearn",
        choices=("client", "class", "sample"),
        default=None,
        help="ask the server to forget this robot's data / a class / samples",
    )
    p.add_argument("--unlearn-classes", default="", help="class request: comma-separated ids")
    p.add_argument("--unlearn-fraction", type=float, default=None, help="sample request: 0..1")
    p.add_argument(
        "--unlearn-after-round",
        type=int,
        default=1,
        help="send the request after uploading this round's update",
    )
    p.add_argument(
        "--faults",
        default="",
        help="comma list: nan,shape,duplicate,replay,forged,"
        "garbage,crash (misbehave on purpose, for tests)",
    )
    p.add_argument("--fault-round", type=int, default=1)
    p.add_argument("--max-runtime", type=float, default=None, help="give up after this long, s")
    p.add_argument("--summary", default=None, help="write the robot's summary JSON here")
    args = p.parse_args(argv)
    setup_app_logging(args)
    install_sigterm()
    from scaleflu.testbed.robot import RobotClient

    cfg = load_config(args.config, args.overrides)
    from scaleflu.testbed.keys import Enrolment

    try:  # this robot's enrolment file: its own key and the server's public key
        enrol = Enrolment.load(args.keys, args.robot_id)
    except (OSError, ValueError) as exc:
        p.error(str(exc))
    unlearn = None
    if args.unlearn:
        unlearn = {"kind": args.unlearn}
        if args.unlearn == "class":
            unlearn["classes"] = [int(c) for c in args.unlearn_classes.split(",") if c]
        if args.unlearn == "sample":
            unlearn["fraction"] = args.unlearn_fraction
    try:
        link = build_link(args, cfg, args.robot_id, [SERVER_ID], args.dev_args, args.dev_args)
    except Exception as exc:  # no radio, port in use, ...: one line, not a traceback
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
        )
        summary = robot.run(args.max_runtime)
    except KeyboardInterrupt:
        log.warning("robot %d interrupted", args.robot_id)
        return 130
    finally:
        link.close()
        if args.summary and summary:
            Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
            Path(args.summary).write_text(json.dumps(summary, indent=1, default=str))
    return 0
