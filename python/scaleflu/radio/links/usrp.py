"""UhdLink: one node on a real radio (link kind ``uhd``).

TX and RX device args are separate because the testbed's edge server receives with a USRP 2955
(X310 + TwinRX, receive only) and transmits with a 2900 (B200). One receiver hears every node
on the frequency.
"""

from __future__ import annotations

import math
from typing import Any

from gnuradio import gr

from scaleflu.link.maclink import MacSetup

from ..phy import PhyConfig, burst_power, phy_rate_bytes_per_s
from .base import GrLink, _arq_block, _attach_rx


class UhdLink(GrLink):
    """One node on a real radio: ofdm_link_tx -> USRP sink, USRP source -> ofdm_link_rx.

    ``tx_args`` and ``rx_args`` name the transmitting and receiving devices (they may be the
    same device, e.g. one B200 at a robot; at the edge server a B200 transmits and the
    receive-only X310/TwinRX receives). Frames are paced to the on-air rate: the ARQ's token
    bucket runs at ``pacing`` x the PHY's back-to-back rate at ``samp_rate``. With ``mac`` (a
    :class:`~scaleflu.link.maclink.MacSetup`) the server-scheduled MAC runs under the ARQ.
    """

    def __init__(
        self,
        node_id: int,
        tx_args: str = "type=b200,master_clock_rate=20e6",
        rx_args: str | None = None,
        freq: float = 2.45e9,
        tx_freq: float | None = None,
        rx_freq: float | None = None,
        samp_rate: float = 5e6,
        tx_gain: float = 60.0,
        rx_gain: float = 30.0,
        tx_antenna: str = "TX/RX",
        rx_antenna: str = "RX2",
        tx_subdev: str = "",
        rx_subdev: str = "",
        clock_source: str = "",
        time_source: str = "",
        lo_offset: float = 0.0,
        tx_rms: float = 0.2,
        pacing: float = 0.9,
        phy: PhyConfig | None = None,
        mac: MacSetup | None = None,
        **arq_opts: Any,
    ) -> None:
        from ..uhd import usrp_rx, usrp_tx

        self.phy = phy or PhyConfig()
        rx_args = tx_args if rx_args is None else rx_args
        self.tb = gr.top_block(f"uhd_ofdm_node_{node_id}")
        # Open the radios first: a missing device fails here, before any thread starts.
        self.sink = usrp_tx(
            tx_args,
            samp_rate,
            tx_freq or freq,
            tx_gain,
            tx_antenna,
            tx_subdev,
            clock_source,
            time_source,
            lo_offset,
        )
        self.source = usrp_rx(
            rx_args,
            samp_rate,
            rx_freq or freq,
            rx_gain,
            rx_antenna,
            rx_subdev,
            clock_source,
            time_source,
            lo_offset,
        )
        opts = dict(arq_opts)
        opts.setdefault("rate_bytes_per_s", pacing * phy_rate_bytes_per_s(self.phy, samp_rate))
        arq = _arq_block(node_id, self.phy, opts)
        amplitude = tx_rms / math.sqrt(burst_power(self.phy))
        self.tx = self.phy.tx(node_id, amplitude=amplitude, mac_chooses=mac is not None)
        self.tb.msg_connect(arq, "frames_out", self.tx, "in")
        self.tb.connect(self.tx, self.sink)
        if self.phy.adaptive and mac is None:  # point to point: the peers' ACKs steer the MCS
            self.tb.msg_connect(arq, "mcs_feedback", self.tx, "feedback")
        self.rx_chains = [
            # a radio hears noise between bursts: gr-digital's demux (docs/link.md 8.3 item 5)
            _attach_rx(
                self.tb,
                self.source,
                arq,
                self.phy,
                None,
                1.0,
                -1,
                node_id + 1,
                blocking_demux=False,
            )
        ]
        super().__init__(arq, on_close=self._stop)
        self.tb.start()
        if mac is not None:
            self._run_mac(mac)

    def _stop(self) -> None:
        self.tb.stop()
        self.tb.wait()
