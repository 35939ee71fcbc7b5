"""The local IP testbed: the edge server and the robots each in a network namespace of their
own, their only interface a TUN carried by the simulated radio.

:class:`LocalIpTestbed` starts the medium of the link kind in this process (the frame hub of
``frames``/``frames-shared``, the sample-level medium broker of ``ofdm-shared``), writes fresh
link keys, and starts one :mod:`scaleflu.iplink.node` process per node (server 0, robots
1..N), whose interface lives in namespace ``sfl-<tag>-<node>``. Then ``run(node, argv)`` /
``popen(node, argv)`` start any program inside a node's namespace (``ip netns exec``): it sees
``lo`` and the tunnel, nothing else, so every packet between nodes crosses the radio::

    with LocalIpTestbed(robots=2, kind="frames-shared") as tb:
        server = tb.popen(0, ["flower-superlink", "--insecure", ...])
        tb.popen(1, ["flower-supernode", "--superlink", f"{tb.address(0)}:9092", ...])

Needs root (:func:`scaleflu.iplink.netns.check_root`: one line without it).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scaleflu.config import default_config
from scaleflu.iplink.bridge import AddressPlan
from scaleflu.iplink.netns import (
    IpLinkError,
    check_root,
    create_namespace,
    delete_namespace,
    in_namespace,
)
from scaleflu.iplink.node import write_key_files
from scaleflu.link import ChannelModel
from scaleflu.link.hub import FrameHub

log = logging.getLogger(__name__)

SERVER = 0
KINDS = ("frames", "frames-shared", "ofdm-shared")
# the MAC for IP over ``testbed.mac``: an idle robot is polled every 50 ms instead of 500 ms,
# so a packet a robot sends unprompted (a TCP ACK, a ping) waits for its grant 25 ms on
# average, not 250 (docs/ip-over-radio.md: measured round trips and the airtime it costs)
TUNNEL_MAC = {"idle_poll_s": 0.05}


class LocalIpTestbed:
    """Server 0 and robots 1..``robots`` on ``kind``, each in its own namespace (docstring).

    ``channel``: the frame hub's ChannelModel fields (default: ``testbed.channel`` of
    default.yaml); ``medium``: the ofdm-shared medium's (``testbed.medium``); ``mac``: the MAC's
    settings over ``testbed.mac`` and :data:`TUNNEL_MAC`; ``arq``: the tunnel's ARQ over its
    defaults; ``rto_min_ms``: TCP's minimum RTO on the tunnel's route; ``reorder``: the
    bridges put messages back in order (off by default: :class:`~scaleflu.iplink.bridge.IpBridge`);
    ``workdir``: where logs, counters and link keys go (default: a temporary folder that
    :meth:`close` removes).
    """

    def __init__(
        self,
        robots: int = 2,
        kind: str = "frames-shared",
        subnet: str = AddressPlan().subnet,
        channel: Mapping[str, Any] | None = None,
        medium: Mapping[str, Any] | None = None,
        mac: Mapping[str, Any] | None = None,
        arq: Mapping[str, Any] | None = None,
        seed: int = 0,
        workdir: str | Path | None = None,
        tag: str | None = None,
        rto_min_ms: int | None = None,
        reorder: bool = False,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"the IP testbed runs {', '.join(KINDS)}; got {kind!r}")
        if robots < 1:
            raise ValueError("robots must be >= 1")
        tb = default_config()["testbed"]
        self.robots = int(robots)
        self.kind = kind
        self.plan = AddressPlan(subnet)
        self.channel = {**tb["channel"], **dict(channel or {})}
        self.medium = {**tb["medium"], **dict(medium or {})}
        mac = {**tb["mac"], **TUNNEL_MAC, **dict(mac or {})}
        self.mac = {k: v for k, v in mac.items() if v is not None}
        self.arq = dict(arq or {})
        self.seed = int(seed)
        self.rto_min_ms = rto_min_ms
        self.reorder = bool(reorder)
        self.tag = tag or uuid.uuid4().hex[:6]
        # a folder of its own (logs, counters, link keys) is removed by close(); a given one stays
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="sfl-ip-"))
        self.nodes = list(range(self.robots + 1))
        self.namespaces = {n: f"sfl-{self.tag}-{n}" for n in self.nodes}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.children: list[subprocess.Popen[Any]] = []
        self._medium: Any = None
        self.medium_address = ""

    # -- set-up ----------------------------------------------------------------------------

    def _start_medium(self) -> None:
        if self.kind in ("frames", "frames-shared"):
            self._medium = FrameHub(
                "tcp://127.0.0.1:0",
                ChannelModel(**self.channel),
                seed=self.seed,
                shared=self.kind == "frames-shared",
            )
        else:
            from scaleflu.radio.medium import LinkChannel, MediumBroker, MediumConfig

            med = self.medium
            ch = LinkChannel(
                snr_db=float(med["snr_db"]),
                fading=str(med["fading"]),
                k_factor_db=float(med["k_factor_db"]),
                doppler_hz=float(med["doppler_hz"]),
            )
            cfg = MediumConfig(
                nodes=tuple(self.nodes),
                seed=self.seed,
                address="tcp://127.0.0.1:0",
                block=int(med["block"]),
                default=ch,
                node_timeout=float(med["node_timeout_s"]),
                hub=SERVER,
                idle_blocks=int(med["idle_blocks"]),
            )
            self._medium = MediumBroker(cfg).start()
        self.medium_address = self._medium.address

    def link_opts(self, node: int) -> dict[str, Any]:
        """The ``open_link`` options of ``node`` (besides the tunnel's ARQ)."""
        robots = tuple(n for n in self.nodes if n != SERVER)
        opts: dict[str, Any] = {"arq": dict(self.arq)} if self.arq else {}
        if self.kind in ("frames", "frames-shared"):
            opts["hub"] = self.medium_address
        else:
            opts["broker"] = self.medium_address
        if self.kind in ("frames-shared", "ofdm-shared"):
            opts.update(
                mac=dict(self.mac),
                server=SERVER,
                # enrolled robots (they hold a key) are members from the start: no JOIN
                members=robots if node == SERVER else (node,),
                seed=self.seed + node,
            )
            if self.kind == "frames-shared":
                opts["rate_bytes_per_s"] = self.channel.get("rate_bytes_per_s")
        return opts

    def start(self, timeout: float = 120.0) -> LocalIpTestbed:
        """Namespaces, medium, keys, node processes; returns when every interface is up."""
        check_root()
        try:
            for ns in self.namespaces.values():
                create_namespace(ns)
            self._start_medium()
            keys = write_key_files(self.workdir / "keys", SERVER, self.nodes[1:])
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            for n in self.nodes:
                argv = [
                    sys.executable,
                    "-m",
                    "scaleflu",
                    "iplink",
                    "node",
                    "--node",
                    str(n),
                    "--kind",
                    self.kind,
                    "--link-opts",
                    json.dumps(self.link_opts(n)),
                    "--keys",
                    str(keys[n]),
                    "--netns",
                    self.namespaces[n],
                    "--ifname",
                    f"sfl{self.tag}{n}"[:15],
                    "--subnet",
                    self.plan.subnet,
                    "--ready-file",
                    str(self.workdir / f"ready-{n}"),
                    "--stats-file",
                    str(self.workdir / f"stats-{n}.json"),
                    "--stats-every",
                    "2",
                ]
                if self.reorder:
                    argv.append("--reorder")
                if self.rto_min_ms:
                    argv += ["--rto-min-ms", str(int(self.rto_min_ms))]
                log_file = open(self.workdir / f"node-{n}.log", "wb")  # noqa: SIM115
                self.procs[n] = subprocess.Popen(argv, stdout=log_file, stderr=log_file, env=env)
                log_file.close()
            deadline = time.monotonic() + timeout
            while not all((self.workdir / f"ready-{n}").is_file() for n in self.nodes):
                dead = [n for n, p in self.procs.items() if p.poll() is not None]
                if dead:
                    tail = (self.workdir / f"node-{dead[0]}.log").read_text()[-600:]
                    raise IpLinkError(f"IP node {dead[0]} exited while starting: {tail.strip()}")
                if time.monotonic() > deadline:
                    raise IpLinkError(f"IP nodes not up after {timeout:.0f} s ({self.workdir})")
                time.sleep(0.1)
        except BaseException:
            self.close()
            raise
        log.info(
            "IP testbed %s: %d nodes on %s, namespaces %s",
            self.tag,
            len(self.nodes),
            self.kind,
            ", ".join(self.namespaces.values()),
        )
        return self

    # -- use ---------------------------------------------------------------------------------

    def address(self, node: int) -> str:
        """Node ``node``'s tunnel address."""
        return str(self.plan.address(node))

    def argv(self, node: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside node ``node``'s namespace."""
        return in_namespace(self.namespaces[node], list(argv))

    def popen(self, node: int, argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside node ``node``'s namespace, in a session of its own (it and its
        children are stopped by :meth:`close`)."""
        proc = subprocess.Popen(self.argv(node, argv), start_new_session=True, **kw)
        self.children.append(proc)
        return proc

    def run(
        self, node: int, argv: Sequence[str], timeout: float = 120.0, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside node ``node``'s namespace to its end (text output captured)."""
        return subprocess.run(
            self.argv(node, argv), capture_output=True, text=True, timeout=timeout, **kw
        )

    def stats(self) -> dict[int, Any]:
        """Every node's last counters (bridge, link)."""
        out = {}
        for n in self.nodes:
            path = self.workdir / f"stats-{n}.json"
            try:
                out[n] = json.loads(path.read_text())
            except (OSError, ValueError):
                out[n] = None
        return out

    def close(self) -> None:
        """Stop the programs started in the namespaces, the nodes, the medium; delete the
        namespaces."""
        for proc in self.children:
            _signal_group(proc, signal.SIGTERM)
        for proc in self.children:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=5)
            _signal_group(proc, signal.SIGKILL)  # what the program left behind
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self._medium is not None:
            self._medium.close()
            self._medium = None
        for ns in self.namespaces.values():
            delete_namespace(ns)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalIpTestbed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    """Send ``sig`` to the session (process group) ``proc`` leads, if it still exists."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
