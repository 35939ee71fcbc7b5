"""Stock Flower over the radio: a SuperLink on the edge server's node, SuperNodes on the robots,
``flwr run`` with the deployment engine, every packet between them over IP over the link.

The local IP testbed (:class:`scaleflu.iplink.testbed.LocalIpTestbed`, root) puts the server
and the robots in network namespaces of their own whose only interface is the tunnel; in them:

* server: ``flower-superlink`` (its HTTP API -- Fleet, Control, Runtime -- on the tunnel
  address, port 9092), and ``flwr run`` of ``examples/flower_unlearning`` against it (inside
  the server's namespace: that traffic stays on the node);
* robot n: ``flower-supernode --superlink <server>:9092 --node-config partition-id=n-1``.

The app is the example (FedAvg on FashionMNIST, LeNet-5, the UnlearningStrategy; robot 2
(client 1) asks to be forgotten in round 2 and SCALE serves it at the end, beside Retrain and
the control; with one robot nobody asks).
Recorded: the run's per-round wall time (the strategy's history: configure -> aggregate,
transfers over the radio included), the whole run, the tunnel's counters per node, and the
tail of ``flwr run``'s output, in ``benchmarks/results/ip_flower.json``.

    sudo PYTHONPATH=python .venv/bin/python benchmarks/ip_flower.py [--kind frames-shared]
        [--rounds 3] [--robots 2] [--loss 0.02]

``--auth``: TLS between the SuperNodes and the SuperLink and Flower's SuperNode authentication
(``--enable-supernode-auth``; a private CA and the robots' EC keys from
:mod:`scaleflu.flower.deploy`, each robot's public key registered with ``flwr supernode
register``), on top of the link's keys that authenticate every frame underneath. An impostor
SuperNode (the CA's certificate, but a key nobody registered) runs beside robot 1 during the
run; what became of it is recorded (``impostor``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scaleflu.iplink.testbed import KINDS, LocalIpTestbed

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("ip_flower")

FED = (
    "seed=0 data.num_clients={n} data.train_subset=2000 data.test_subset=500 data.partition=iid "
    "data.poison.backdoor_clients={bd} data.poison.backdoor_fraction=0.3 "
    "fl.clients_per_round={n} fl.local_epochs=1 fl.lr=0.02 fl.momentum=0.5 fl.batch_size=32 "
    "fl.trainer=sequential fl.threads=1"
)


def _bin(name: str) -> str:
    path = shutil.which(name) or str(Path(sys.executable).with_name(name))
    if not Path(path).exists():
        raise SystemExit(f"{name} not found: install Flower (pip install 'gr-scaleflu[flower]')")
    return path


def _wait_port(tb: LocalIpTestbed, node: int, host: str, port: int, timeout: float) -> None:
    """Wait until something listens on host:port inside node ``node``'s namespace."""
    code = (
        "import socket, sys, time\n"
        f"end = time.time() + {timeout}\n"
        "while time.time() < end:\n"
        "    try:\n"
        f"        socket.create_connection(({host!r}, {port}), timeout=2).close(); sys.exit(0)\n"
        "    except OSError:\n"
        "        time.sleep(0.5)\n"
        "sys.exit(1)\n"
    )
    if tb.run(node, [sys.executable, "-c", code], timeout=timeout + 10).returncode != 0:
        raise SystemExit(f"nothing listens on {host}:{port} after {timeout:.0f} s")


class _Direct:
    """The baseline without the radio: every process in this namespace, on 127.0.0.1."""

    def __init__(self, robots: int) -> None:
        self.nodes = list(range(robots + 1))
        self.children: list[subprocess.Popen[Any]] = []

    def __enter__(self) -> _Direct:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.children:
            try:
                os.killpg(p.pid, 15)
                p.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass

    def address(self, node: int) -> str:
        return "127.0.0.1"

    def popen(self, node: int, argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        if "--node-config" in argv and "--port" not in argv:  # each SuperNode its own port
            argv = [*argv, "--port", str(9194 + node)]
        proc = subprocess.Popen(argv, start_new_session=True, **kw)
        self.children.append(proc)
        return proc

    def run(self, node: int, argv: list[str], timeout: float = 120.0, **kw: Any) -> Any:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)

    def stats(self) -> dict[int, Any]:
        return {}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One Flower run over the tunnel; its measurements."""
    work = Path(args.workdir or f"/tmp/sfl-ip-flower-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    channel = {} if args.loss is None else {"loss": args.loss}
    mac = {} if args.idle_poll is None else {"idle_poll_s": args.idle_poll}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]),
        # Flower's processes start others (flower-superexec) by name: this environment's first
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "OMP_NUM_THREADS": "1",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
    }
    out: dict[str, Any] = {
        "kind": args.kind,
        "robots": args.robots,
        "rounds": args.rounds,
        "rto_min_ms": args.rto_min_ms,
    }
    t_setup = time.perf_counter()
    testbed: Any = (
        _Direct(args.robots)
        if args.direct
        else LocalIpTestbed(
            args.robots,
            args.kind,
            channel=channel,
            mac=mac,
            workdir=work,
            rto_min_ms=args.rto_min_ms,
        )
    )
    with testbed as tb:
        out["testbed_up_s"] = time.perf_counter() - t_setup
        server = tb.address(0)
        homes = {n: work / f"flwr-home-{n}" for n in tb.nodes}
        for h in homes.values():
            h.mkdir()
        auth: dict[str, Any] = {}
        if args.auth:  # TLS + Flower's SuperNode authentication
            from scaleflu.flower.deploy import write_supernode_key, write_tls

            tls = write_tls(work / "tls", [server, "127.0.0.1"])
            auth["tls"] = tls
            auth["keys"] = {n: write_supernode_key(work / "tls", f"robot{n}") for n in tb.nodes[1:]}
            conn = f'address = "{server}:9092"\nroot-certificates = "{tls.ca_cert}"\n'
        else:
            conn = f'address = "{server}:9092"\ninsecure = true\n'
        (homes[0] / "config.toml").write_text(
            '[superlink]\ndefault = "testbed"\n\n[superlink.testbed]\n' + conn
        )
        logs = {}

        def start(node: int, argv: list[str], name: str) -> subprocess.Popen[Any]:
            fh = open(work / f"{name}.log", "w")  # noqa: SIM115
            logs[name] = work / f"{name}.log"
            return tb.popen(
                node,
                argv,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env={**env, "FLWR_HOME": str(homes[node])},
                cwd=str(work),
            )

        security = (
            [
                "--ssl-ca-certfile",
                str(auth["tls"].ca_cert),
                "--ssl-certfile",
                str(auth["tls"].cert),
                "--ssl-keyfile",
                str(auth["tls"].key),
                "--enable-supernode-auth",
            ]
            if auth
            else ["--insecure"]
        )
        start(
            0,
            [
                _bin("flower-superlink"),
                *security,
                "--isolation",
                "subprocess",
                "--disable-runtime-dependency-installation",
                "--database",
                str(work / "superlink.db"),
                "--host",  # one HTTP API (Fleet, Control, Runtime) on the tunnel address
                server,
                "--port",
                "9092",
            ],
            "superlink",
        )
        _wait_port(tb, 0, server, 9092, 180.0)
        out["supernode_auth"] = bool(auth)
        if auth:  # register each robot's public key with the SuperLink (Control API, TLS)
            out["register"] = []
            for n in tb.nodes[1:]:
                reg = tb.run(
                    0,
                    [_bin("flwr"), "supernode", "register", str(auth["keys"][n][1]), "testbed"],
                    env={**env, "FLWR_HOME": str(homes[0])},
                    cwd=str(work),
                )
                out["register"].append((reg.returncode, (reg.stdout + reg.stderr)[-400:]))
        for n in tb.nodes[1:]:
            node_security = (
                [
                    "--root-certificates",
                    str(auth["tls"].ca_cert),
                    "--auth-supernode-private-key",
                    str(auth["keys"][n][0]),
                ]
                if auth
                else ["--insecure"]
            )
            start(
                n,
                [
                    _bin("flower-supernode"),
                    *node_security,
                    "--superlink",
                    f"{server}:9092",
                    "--node-config",
                    f"partition-id={n - 1} num-partitions={args.robots}",
                ],
                f"supernode-{n}",
            )
        if auth:  # an impostor on robot 1's node: a SuperNode whose key nobody registered
            key, _ = write_supernode_key(work / "tls", "impostor")
            impostor = start(
                1,
                [
                    _bin("flower-supernode"),
                    "--root-certificates",
                    str(auth["tls"].ca_cert),
                    "--auth-supernode-private-key",
                    str(key),
                    "--superlink",
                    f"{server}:9092",
                    "--port",
                    "9099",
                    "--node-config",
                    f"partition-id=0 num-partitions={args.robots}",
                ],
                "supernode-impostor",
            )
        run_dir = work / "run"
        # robot 2 (client 1, with a backdoor) asks to be forgotten; a lone robot does not (no
        # client would remain)
        forget = args.robots >= 2
        rc = (
            f"num-server-rounds={args.rounds} run-dir='{run_dir}' "
            f"scaleflu-set='{FED.format(n=args.robots, bd=[1] if forget else [])}' "
            f"forget-client={1 if forget else -1} forget-round=2 "
            "unlearn-set='scale.eval.relearn_max_rounds=0'"
        )
        t0 = time.perf_counter()
        flwr = tb.run(
            0,
            [
                _bin("flwr"),
                "run",
                str(ROOT / "examples" / "flower_unlearning"),
                "testbed",
                "--stream",
                "--run-config",
                rc,
            ],
            timeout=args.timeout,
            env={**env, "FLWR_HOME": str(homes[0])},
            cwd=str(work),
        )
        out["flwr_run_s"] = time.perf_counter() - t0
        out["flwr_run_rc"] = flwr.returncode
        out["flwr_run_output_tail"] = (flwr.stdout + flwr.stderr)[-6000:]
        metrics = run_dir / "metrics.jsonl"
        rows = (
            [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.is_file() else []
        )
        out["rounds_recorded"] = [
            {k: r.get(k) for k in ("round", "participants", "wall_s", "test_acc")} for r in rows
        ]
        side = run_dir / "unlearn" / "side_by_side.json"
        out["served"] = json.loads(side.read_text()) if side.is_file() else None
        if auth:  # what became of the impostor, and how many nodes the SuperLink activated
            superlink_log = (work / "superlink.log").read_text(errors="replace")
            out["impostor"] = {
                "exited": impostor.poll(),
                "log_tail": (work / "supernode-impostor.log").read_text(errors="replace")[-1500:],
                "superlink_activated_nodes": superlink_log.count("Activated node_id"),
            }
        time.sleep(2.5)  # the nodes' counters are rewritten every 2 s
        out["tunnel"] = tb.stats()
        out["logs"] = {k: str(v) for k, v in logs.items()}
    out["total_s"] = time.perf_counter() - t_setup
    return out


def main() -> int:
    """Run and write ``benchmarks/results/ip_flower.json``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=KINDS, default="frames-shared")
    p.add_argument("--robots", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--loss", type=float, default=None, help="frame loss (frame hub kinds)")
    p.add_argument("--idle-poll", type=float, default=None, help="MAC idle poll, s")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--rto-min-ms", type=int, default=None, help="TCP's minimum RTO (route)")
    p.add_argument("--auth", action="store_true", help="TLS and Flower's SuperNode authentication")
    p.add_argument("--direct", action="store_true", help="baseline: no radio, all on 127.0.0.1")
    p.add_argument("--workdir", default=None)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ip_flower.json")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    res = run(args)
    res["machine"] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "load_avg_at_end": os.getloadavg(),
    }
    try:
        import flwr

        res["flwr"] = flwr.__version__
    except Exception:  # noqa: BLE001
        res["flwr"] = None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    prev = json.loads(args.out.read_text()) if args.out.is_file() else {}
    key = "direct" if args.direct else args.kind
    prev[key + ("-auth" if args.auth else "")] = res
    args.out.write_text(json.dumps(prev, indent=2))
    log.info(
        "%s: flwr run rc %s in %.1f s; rounds %s",
        key,
        res["flwr_run_rc"],
        res["flwr_run_s"],
        [(r["round"], round(r["wall_s"], 1)) for r in res["rounds_recorded"]],
    )
    return 0 if res["flwr_run_rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
