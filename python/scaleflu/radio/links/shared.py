"""SharedMediumLink: one node per process on ONE simulated frequency (link kind ``ofdm-shared``).

A broker (:mod:`scaleflu.radio.medium`) adds every transmitter into one sample stream in virtual
sample time and gives each receiver the sum through its own per-link channel (path loss, CFO,
timing/sample-rate offset, fading, noise), so bursts that overlap collide. The node's flowgraph
is link_arq -> OFDM tx -> :class:`~scaleflu.radio.medium.port.MediumPort` -> OFDM rx -> link_arq.
"""

from __future__ import annotations

import math
from typing import Any

from gnuradio import gr

from scaleflu.link.maclink import MacSetup
from scaleflu.link.mcs import MCS_TABLE

from ..medium.broker import broker_stats
from ..medium.config import DEFAULT_MEDIUM_ADDRESS
from ..medium.port import MediumPort
from ..phy import PhyConfig, burst_power
from .base import GrLink, _arq_block


class SharedMediumLink(GrLink):
    """A Link (scaleflu.link.api) of ``node_id`` on the medium of the broker at ``broker``.

    Options: ``phy`` (PhyConfig), ``timeout`` (wall seconds to wait for the broker),
    ``virtual_clock`` (True: the ARQ's timers, send deadlines and a MAC put under the link run
    on the medium's virtual time, so a slow machine runs slower, not differently), ``mac``
    (a :class:`~scaleflu.link.maclink.MacSetup`: the server-scheduled MAC under the ARQ, on
    the link's clock), ARQ options (window, initial_rto, deadline, ...).
    """

    def __init__(
        self,
        node_id: int,
        broker: str = DEFAULT_MEDIUM_ADDRESS,
        phy: PhyConfig | None = None,
        timeout: float = 120.0,
        virtual_clock: bool = True,
        rx_lag: int | None = 1,
        mac: MacSetup | None = None,
        **arq_opts: Any,
    ) -> None:
        self.phy = phy or PhyConfig()
        self.tb = gr.top_block(f"shared_medium_node_{node_id}")
        arq = _arq_block(node_id, self.phy, arq_opts)
        self.tx = self.phy.tx(
            node_id, amplitude=1.0 / math.sqrt(burst_power(self.phy)), mac_chooses=mac is not None
        )
        if self.phy.coded:  # the port's tap is a Python block: room for whole trains
            self.tx.set_output_bursts(8)
        # whole checked frames into link_arq (no per-frame re-encode in Python); the
        # parser counts a frame in frames_ok() exactly when it publishes it, in either
        # mode, so rx_pending below stays exact
        # gr-digital's demux here, not ofdm_burst_demux: the medium's receivers hear noise
        # and others' bursts between their frames, where ours is not validated (docs/link.md
        # 8.3 item 5)
        self.rx = self.phy.rx(node_id, raw_frames=True, blocking_demux=False)
        self.port = MediumPort(
            node_id, broker, timeout, frames_built=self.tx.frames_built, rx_lag=rx_lag
        )
        self.tb.msg_connect(arq, "frames_out", self.tx, "in")
        self.tb.connect(self.tx, self.port.tx_sink)
        self.tb.connect(self.port.rx_source, self.rx)
        self.tb.msg_connect(self.rx, "out", arq, "frames_in")
        if self.phy.adaptive and mac is None:  # no MAC: the peers' ACKs steer the MCS
            self.tb.msg_connect(arq, "mcs_feedback", self.tx, "feedback")
        super().__init__(arq, on_close=self._stop)
        self.virtual_clock = virtual_clock
        if virtual_clock:  # ARQ timers (and the MAC under the link) on the medium's time
            arq.link.set_clock(self.port.virtual_time)
            self.port.on_step.append(arq.link.clock_advanced)
        self.port.on_error = self._medium_lost
        self.port.rx_pending = lambda: self.rx.frames_ok() - arq.frames_done
        # ... and until its receiver's demux has decided on all but the last block and the
        # frame in progress: a receiver starved of CPU (a robot training beside its radio)
        # otherwise decoded a grant many blocks late when the medium ran fast, and answered
        # past the grant's window (collided samples)
        hpd = self.rx.hpd
        self.port.rx_progress = lambda: int(hpd.nitems_read(0))
        longest = self.phy.frame_samples(self.phy.mtu)
        if self.phy.coded:  # any MCS may come in
            longest = max(self.phy.frame_samples(self.phy.mtu, m.index) for m in MCS_TABLE)
        self.port.rx_slack = longest + 4096
        link_lock = arq.link._lock

        def frames_posted() -> int:
            # under the link's lock: the MAC posts a whole downlink burst or grant answer
            # under it, so the port never starts a train the MAC is still posting (a train
            # split by idle blocks ended after the window the grant announced)
            with link_lock:
                return arq.frames_out_count

        self.port.frames_posted = frames_posted
        arq.on_progress = self.port.poke  # a frame handled or put out: the lockstep looks again
        self.tb.start()
        self.port.start()
        if mac is not None:
            self._run_mac(mac)
            m = self.mac
            # the server's MAC expects traffic (an answer to its grant, its own frames): no
            # idle stride, however late a robot's receiver decodes the grant
            self.port.hold = lambda: bool(getattr(m, "busy", False))

    def _wait_limit(self, timeout: float | None) -> float | None:
        # On the medium's clock the ARQ ends every send at its deadline in virtual time,
        # however slowly the medium runs; a lost medium cancels the sends (_medium_lost).
        if self.virtual_clock:
            return None
        return super()._wait_limit(timeout)

    def _medium_lost(self, exc: BaseException) -> None:
        link = self.arq.link
        with link._wake:
            link.endpoint.cancel_all(f"medium lost: {exc}")
            link._wake.notify_all()

    def virtual_time(self) -> float:
        """The medium's virtual time in seconds (see MediumPort.virtual_time)."""
        return self.port.virtual_time()

    def medium_stats(self) -> dict[str, Any]:
        """The broker's counters: virtual time, airtime per node, collided samples."""
        return broker_stats(self.port.client.address, timeout=2.0)

    def counters(self) -> dict[str, int]:
        """Receiver counters and lockstep steps of this node."""
        return {
            "frames_ok": self.rx.frames_ok(),
            "crc_errors": self.rx.crc_errors(),
            "malformed": self.rx.malformed(),
            "headers_rejected": self.rx.headers_rejected(),
            "steps": self.port.steps,
            "tx_samples": self.port.tx_samples,
            "stalls_tx": self.port.stalls["tx"],
            "stalls_rx": self.port.stalls["rx"],
            **{f"wait_{k}_s": round(v, 3) for k, v in self.port.wait_s.items()},
        }

    def _stop(self) -> None:
        self.port.close()
        self.tb.stop()
        self.tb.wait()
