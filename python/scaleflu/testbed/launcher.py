"""The one-command local testbed: an edge server and N robots as processes on one machine.

:func:`run_testbed` (``apps/testbed.py``, ``scaleflu testbed``, ``make demo``; the command line
is :mod:`scaleflu.cli.testbed`) generates random pre-shared keys, writes the resolved config
(the demo settings below over the defaults, then the user's file and ``--set`` overrides),
starts the channel (``ofdm-shared``, the default: the sample-level shared medium's broker, one
simulated frequency with fading, every node an OFDM transmitter and receiver with the MAC; the
frame hub of the ``frames-shared`` and ``frames`` links; nothing for ``ofdm-pairs`` where the
processes exchange OFDM samples over ZeroMQ), the edge server and the robots, shows progress,
and prints the server's summary. The last robot's data carries the backdoor trigger (the
client-unlearning protocol, docs/scale.md) and it asks to be forgotten after
``--unlearn-after-round``. Ctrl-C stops every child. Everything lands in
``runs/testbed-<time>/``: config, logs, history, report, plots.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from scaleflu.config import (
    Config,
    _read_file,
    absolute_plugin,
    as_config,
    default_config,
    merge,
    parse_override,
    save_config,
)
from scaleflu.fl.data import load_datasets, make_partitions
from scaleflu.link import ChannelModel
from scaleflu.link.hub import FrameHub, HubPhy
from scaleflu.link.mcs import mcs_name
from scaleflu.linkkinds import canonical_kind
from scaleflu.testbed.keys import KeyStore
from scaleflu.testbed.protocol import client_of, robot_of

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[3]
APPS = ROOT / "apps"


def _read_json(path: Path) -> Any:
    """A JSON file's content, None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def app_command(name: str) -> list[str]:
    """How to start ``edge_server``/``robot_client``: the checkout's app, else the module."""
    script = APPS / f"{name}.py"
    if script.is_file():
        return [sys.executable, str(script)]
    return [sys.executable, "-m", "scaleflu.cli.testbed", name]  # an installed package


# Small enough for a few minutes on 2 cores, large enough to learn and to show the backdoor.
DEMO_SETTINGS: dict[str, Any] = {
    "data": {
        "train_subset": 12000,
        "test_subset": 2000,
        "alpha": 0.5,
        "poison": {"backdoor_fraction": 0.5, "target_label": 0, "trigger_size": 3},
    },
    "model": {"name": "lenet"},
    "fl": {"local_epochs": 2, "lr": 0.05, "momentum": 0.5, "batch_size": 32, "threads": 1},
    "scale": {
        "ppo": {"episodes": 50, "n_steps": 64, "batch_size": 32, "epochs": 4},
        "val_size": 300,
        "recovery_rounds": 2,  # the backdoor of a large robot outlives one recovery round
        "recovery_local_epochs": 2,
        "eval": {"max_samples": 2000, "mia_samples": 300, "relearn_max_rounds": 0},
    },
}

_ROBOT_EVAL = re.compile(r"robot \d+: \w+ model: ")
_LOGLINE = re.compile(r"\d\d:\d\d:\d\d ")
_ECHO = re.compile(
    r"registered|refused|round \d+ (done|closed|progress)|rejected|unlearn|Phase I|resuming|"
    r"report written|"
    r"model r\d+ -> robot \d+.*failed|fewer than|Error|Traceback"
)


def free_port() -> int:
    """A TCP port free on localhost right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_block(n: int) -> int:
    """A base port with ``n`` consecutive free ports (ofdm-pairs binds base + node id)."""
    for _ in range(200):
        base = random.randint(20000, 60000 - n)
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no block of free ports found")


class Child:
    """One app process with its log file; lines of interest are echoed to the console."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, echo: IO[str] | None) -> None:
        self.name, self.cmd, self.log_path, self.echo = name, cmd, log_path, echo
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._thread: threading.Thread | None = None
        self.starts = 0

    def start(self) -> None:
        """Start (or restart) the process."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        self.starts += 1
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with self.log_path.open("a") as fh:
            for line in self.proc.stdout:
                fh.write(line)
                fh.flush()
                self.lines.append(line)
                if (
                    self.echo is not None
                    and _LOGLINE.match(line)
                    and _ECHO.search(line)
                    and "scaleflu.link" not in line
                    and not _ROBOT_EVAL.search(line)  # the server prints each evaluation
                ):
                    self.echo.write(f"[{self.name}] {line.split(': ', 1)[-1]}")
                    self.echo.flush()

    def alive(self) -> bool:
        """Whether the process is running."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, wait: float = 8.0) -> None:
        """Signal the process (its own process group) and wait; SIGKILL when it lingers."""
        if not self.alive():
            return
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(wait)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(5)

    def join_output(self, timeout: float = 5.0) -> None:
        """Wait for the log pump to drain."""
        if self._thread is not None:
            self._thread.join(timeout)


def _rounds_done(run_dir: Path) -> int:
    """The last round the server has recorded (from its rounds.jsonl)."""
    rows = run_dir / "rounds.jsonl"
    if not rows.is_file():
        return 0
    done = [json.loads(x)["round"] for x in rows.read_text().splitlines() if x.strip()]
    return max(done, default=0)


def largest_robot(cfg: Config) -> int:
    """The robot with the most training samples under the config's seeded partition."""
    clean, _ = load_datasets(cfg.data, int(cfg.seed))
    parts = make_partitions(cfg.data, clean.labels, int(cfg.seed))
    return robot_of(max(range(len(parts)), key=lambda n: len(parts[n])))


def build_config(args: argparse.Namespace) -> Config:
    """Defaults, demo settings, the user's file, then --set overrides; robot count wired in.

    The backdoored robot (the one that asks to be forgotten) is ``--backdoor-robot``, by default
    the robot with the most data: with three robots a trigger carried by a small share of the
    federation is averaged away within a few rounds and there would be nothing to forget.
    """
    n = args.robots
    demo = json.loads(json.dumps(DEMO_SETTINGS))
    demo["data"]["num_clients"] = n
    demo["data"]["poison"]["backdoor_clients"] = []
    demo["fl"]["clients_per_round"] = n
    demo["testbed"] = {"robots": n, "rounds": args.rounds, "min_robots": n, "link": args.link}
    if getattr(args, "mcs", None):
        demo["testbed"]["mcs"] = mcs_name(args.mcs)
    # the demo serves the request with one method and runs Retrain and the fine-tune control on
    # it too (cheap at the demo's size): the summary prints them side by side
    demo["testbed"]["unlearn"] = {"compare": ["retrain", "finetune"]}
    if getattr(args, "unlearn", None) == "none":
        # no robot it starts will ask: the server does not wait for a request after the last
        # round (testbed.unlearn.wait_s, 120 s by default, for robots started elsewhere; a
        # file or --set still sets it)
        demo["testbed"]["unlearn"]["wait_s"] = 0.0
    if args.method:
        demo["testbed"]["unlearn"]["method"] = args.method
    cfg = merge(default_config(), demo)
    if args.config:
        cfg = merge(cfg, _read_file(Path(args.config)))
    for o in args.overrides:
        cfg = merge(cfg, parse_override(o))
    extra = [absolute_plugin(p) for p in getattr(args, "plugins", None) or []]
    cfg["plugins"] = [*cfg["plugins"], *(p for p in extra if p not in cfg["plugins"])]
    cfg = as_config(cfg)  # checked at once: a bad file or --set fails before anything starts
    if args.backdoor_robot is None:
        args.backdoor_robot = largest_robot(cfg)
    if not cfg.data.poison.backdoor_clients:
        cfg.data.poison.backdoor_clients = [client_of(args.backdoor_robot)]
    return as_config(cfg)  # the backdoor robot must be an FL client


def start_medium(cfg: Config, args: argparse.Namespace) -> tuple[Any, str]:
    """The sample-level shared medium of ``ofdm-shared`` (a broker thread in the launcher).

    Server 0 and robots 1..N on one frequency, every link with ``testbed.medium``'s fading and
    mean SNR (``--fading``, ``--snr-db`` override), seeded by the run's seed.
    """
    from scaleflu.radio.medium import LinkChannel, MediumBroker, MediumConfig

    med = cfg.testbed.medium
    fading = args.fading or str(med.fading)
    snr = float(med.snr_db if args.snr_db is None else args.snr_db)
    ch = LinkChannel(
        snr_db=snr,
        fading=fading,
        k_factor_db=float(med.k_factor_db),
        doppler_hz=float(med.doppler_hz),
    )
    mcfg = MediumConfig(
        nodes=tuple(range(args.robots + 1)),
        seed=int(cfg.seed),
        address="tcp://127.0.0.1:0",
        block=int(med.block),
        default=ch,
        node_timeout=float(med.node_timeout_s),
        hub=0,  # the robots take frames from the server only: they skip each other's uploads
        # the stride waits for idle_blocks quiet blocks and never runs while the server's MAC
        # expects an answer (a robot that trains beside its radio may decode its grant a few
        # blocks late; a stride then put its answer past the grant's window)
        idle_blocks=int(med.idle_blocks),
        deaf_blocks=int(med.deaf_blocks),
    )
    broker = MediumBroker(mcfg).start()
    phy = str(cfg.testbed.mcs)
    phy = {
        "adaptive": "coded OFDM, the MAC adapts each robot's MCS",
        "stock": "the paper's uncoded QPSK (stock OFDM)",
    }.get(phy, f"coded OFDM at {phy}")
    k = f", K = {ch.k_factor_db:g} dB" if fading == "rician" else ""
    desc = (
        f"one simulated frequency (ofdm-shared, broker {broker.address}): {fading} fading"
        f"{k}, {ch.doppler_hz:g} Hz Doppler, {snr:g} dB mean SNR on every link, "
        f"{mcfg.samp_rate / 1e6:g} MS/s; {phy}; server-scheduled MAC, broadcast downlink"
    )
    return broker, desc


def run_testbed(args: argparse.Namespace) -> int:
    """Run the local testbed from parsed options; returns the exit status."""
    args.link = canonical_kind(args.link)
    if args.outsider_rate > 0 and args.link not in ("frames", "frames-shared"):
        raise ValueError("--outsider-rate needs a frame hub (--link frames or frames-shared)")
    t_start = time.monotonic()
    runs = ROOT / "runs" if APPS.is_dir() else Path("runs")
    cfg = build_config(args)
    run_dir = Path(args.out or runs / f"testbed-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    cfg_path = save_config(cfg, run_dir / "testbed.yaml")
    # Keys live outside the run folder (a private temporary folder, removed at the end): the
    # server gets the store, each robot only its own enrolment file.
    key_dir = Path(tempfile.mkdtemp(prefix="scaleflu-keys-"))
    store = KeyStore.create(list(range(1, args.robots + 1)))
    keys_path = store.save(key_dir / "server.json")
    robot_keys = {r: store.write_enrolment(r, key_dir / f"robot{r}.json") for r in store.robots}
    del store
    echo = None if args.quiet else sys.stdout
    out = sys.stdout
    tb = cfg.testbed
    out.write(
        f"testbed: {args.robots} robots, {args.rounds} rounds, link {args.link}, "
        f"run folder {run_dir}\n"
    )
    asks = (
        "no robot asks to be forgotten (--unlearn none)"
        if args.unlearn == "none"
        else f"it asks to be forgotten ({args.unlearn}) after round "
        f"{args.unlearn_after_round or args.rounds}"
    )
    out.write(
        f"robot {args.backdoor_robot} carries the backdoor trigger "
        f"(target label {cfg.data.poison.target_label}); {asks}\n"
    )

    hub = None
    broker = None
    link_args: list[str] = ["--link", args.link]
    if args.link == "ofdm-shared":
        broker, desc = start_medium(cfg, args)
        link_args += ["--broker", broker.address]
        out.write(f"channel: {desc}\n")
    elif args.link in ("frames", "frames-shared"):
        ch = dict(tb.channel)
        if args.loss is not None:
            ch["loss"] = args.loss
        shared = args.link == "frames-shared"
        phy = None
        if shared:  # the PHY at frame level: testbed.medium's channel, the MCS error curves
            med = cfg.testbed.medium
            phy = HubPhy(
                snr_db=float(med.snr_db if args.snr_db is None else args.snr_db),
                fading=args.fading or str(med.fading),
                k_factor_db=float(med.k_factor_db),
                doppler_hz=float(med.doppler_hz),
                seed=int(cfg.seed),
            )
        hub = FrameHub(
            "tcp://127.0.0.1:0", ChannelModel(**ch), seed=int(cfg.seed), shared=shared, phy=phy
        )
        link_args += ["--hub", hub.address]
        out.write(
            f"channel: frame hub {hub.address} {ch}"
            + (
                f" on one frequency, server-scheduled MAC; PHY model {cfg.testbed.mcs} at "
                f"{phy.snr_db:g} dB mean, {phy.fading} fading\n"
                if shared and phy is not None
                else "\n"
            )
        )
    else:
        base = free_port_block(args.robots + 1)
        snr = 20.0 if args.snr_db is None else args.snr_db
        link_args += [
            "--base-port",
            str(base),
            "--snr-db",
            str(snr),
            "--drop-rate",
            str(args.drop_rate),
        ]
        out.write(
            f"channel: OFDM over ZeroMQ ports {base}.., SNR {snr} dB, frame drop {args.drop_rate}\n"
        )
    common = ["--config", str(cfg_path), *link_args]  # keys: the server's store, each robot its own
    server_cmd = [*app_command("edge_server"), *common, "--keys", str(keys_path)]
    server = Child(
        "server",
        [*server_cmd, "--run-dir", str(run_dir), "--no-progress"],
        run_dir / "logs" / "server.log",
        echo,
    )
    after = args.unlearn_after_round or args.rounds
    robots: dict[int, Child] = {}
    for r in range(1, args.robots + 1):
        cmd = [
            *app_command("robot_client"),
            *common,
            "--keys",
            str(robot_keys[r]),
            "--robot-id",
            str(r),
            "--summary",
            str(run_dir / "logs" / f"robot{r}.json"),
            "--max-runtime",
            str(args.timeout),
        ]
        if r == args.backdoor_robot and args.unlearn != "none":
            cmd += ["--unlearn", args.unlearn, "--unlearn-after-round", str(after)]
            cmd += ["--receipts", str(run_dir / "logs" / f"robot{r}-receipts")]
            if args.unlearn == "class":
                cmd += ["--unlearn-classes", "0"]
            if args.unlearn == "sample":
                cmd += ["--unlearn-fraction", "0.5"]
        if r == args.attacker_robot:
            cmd += ["--faults", "nan,shape,duplicate,replay,forged,garbage", "--fault-round", "1"]
        if r == args.kill_robot:
            cmd += ["--faults", "crash", "--fault-round", str(args.kill_round)]
        robots[r] = Child(f"robot{r}", cmd, run_dir / "logs" / f"robot{r}.log", echo)
    outsider = None
    if args.outsider_rate > 0 and hub is not None:
        outsider = Child(
            "outsider",
            [sys.executable, "-m", "scaleflu.testbed.outsider", "--hub", hub.address,
             "--robots", str(args.robots), "--rate", str(args.outsider_rate),
             "--summary", str(run_dir / "logs" / "outsider.json")],
            run_dir / "logs" / "outsider.log",
            None,
        )  # fmt: skip
    rejoined: set[int] = set()
    died_noted = False
    restarted = False
    rc = 1
    try:
        server.start()
        for ch in robots.values():
            ch.start()
        if outsider is not None:
            outsider.start()
            out.write(
                f"[testbed] keyless outsider floods the hub at {args.outsider_rate:g} frames/s\n"
            )
        deadline = time.monotonic() + args.timeout
        collisions: dict[int, Any] = {}  # collisions so far when each round was recorded
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if hub is not None or broker is not None:
                done = _rounds_done(run_dir)
                if done and done not in collisions:
                    collisions[done] = (
                        hub.collided_frames
                        if hub is not None
                        else broker.stats()["collision_samples"] / broker.cfg.samp_rate
                    )
            if not server.alive():
                rc = server.proc.returncode if server.proc else 1
                if rc == 0 or restarted or args.restart_server_after_round is None:
                    break
            if args.restart_server_after_round is not None and not restarted:
                if _rounds_done(run_dir) >= args.restart_server_after_round:
                    out.write(
                        f"[testbed] kill -9 the edge server after round "
                        f"{args.restart_server_after_round}; restarting it\n"
                    )
                    server.stop(signal.SIGKILL)
                    server.start()
                    restarted = True
            for r, ch in robots.items():
                if r == args.kill_robot and r not in rejoined and not ch.alive():
                    if not died_noted:
                        out.write(
                            f"[testbed] robot {r} died in round {args.kill_round}; it "
                            "rejoins once the round has closed\n"
                        )
                        died_noted = True
                    if _rounds_done(run_dir) >= args.kill_round:
                        i = ch.cmd.index("--faults")
                        del ch.cmd[i : i + 4]
                        ch.start()
                        rejoined.add(r)
                        out.write(f"[testbed] robot {r} restarted\n")
        else:
            out.write("[testbed] timeout: stopping\n")
        server.join_output()
        for ch in robots.values():
            if ch.proc is not None:
                try:
                    ch.proc.wait(20)
                except subprocess.TimeoutExpired:
                    ch.stop()
    except KeyboardInterrupt:
        out.write("\n[testbed] Ctrl-C: stopping the edge server and the robots\n")
        rc = 130
    finally:
        for ch in [server, *robots.values(), *([outsider] if outsider else [])]:
            ch.stop()
        if hub is not None:
            hub.close()
        medium = None
        if broker is not None:
            medium = {k: v for k, v in broker.stats().items() if k != "links"}
            broker.close()
        shutil.rmtree(key_dir, ignore_errors=True)
    total = time.monotonic() - t_start
    text = "".join(server.lines)
    if "=== SCALE testbed summary" in text:
        out.write(text[text.index("=== SCALE testbed summary") - 1 :])
    report = run_dir / "report.json"
    if report.is_file():
        data = json.loads(report.read_text())
        data["launcher"] = {
            "total_s": total,
            "link": args.link,
            "hub": None
            if hub is None
            else {
                "frames_in": hub.frames_in,
                "frames_out": hub.frames_out,
                "bytes_in": hub.bytes_in,
                "shared": hub.shared,
                "collided_frames": hub.collided_frames,
                "collided_frames_at_round_end": collisions,
            },
            "medium": None
            if medium is None
            else {**medium, "collision_s_at_round_end": collisions},
            "robot_starts": {r: ch.starts for r, ch in robots.items()},
            "outsider": _read_json(run_dir / "logs" / "outsider.json"),
            "server_starts": server.starts,
        }
        report.write_text(json.dumps(data, indent=1, default=str))
        if hub is not None and hub.shared:
            out.write(
                f"collided frames on the shared medium: {hub.collided_frames} in all; "
                f"cumulative at the end of each round {collisions}\n"
            )
        if medium is not None:
            air = sum(medium["airtime_s"].values())
            out.write(
                f"shared medium: {medium['virtual_s']:.1f} s of virtual time, {air:.2f} s on "
                f"air, {medium['collision_s']:.4f} s of collided samples in all (cumulative at "
                f"the end of each round { ({k: round(v, 4) for k, v in collisions.items()}) })\n"
            )
        out.write(f"testbed done in {total:.0f}s; report {report} and plots in {run_dir}\n")
        return 0 if rc in (0, None) else rc
    out.write(f"testbed failed (server exit {rc}); logs in {run_dir / 'logs'}\n")
    return rc or 1
