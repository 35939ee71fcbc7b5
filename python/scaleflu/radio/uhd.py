"""UHD front ends of the OFDM link with a clear error when no radio answers.

``usrp_tx`` (complex in -> USRP sink, burst mode on the "packet_len" tags of ofdm_link_tx) and
``usrp_rx`` (USRP source -> complex out) wrap gr-uhd so that a missing device gives one line,
``RadioNotFound: no USRP found for device args "type=b200" (TX)``, instead of UHD's lookup
traceback. With ``exit_on_missing=True`` (what the GRC blocks use) the error ends the program
through SystemExit, which Python prints as that single line with exit status 1.

Testbed facts (docs/testbed.md): the USRP 2955 (X310 + 2 TwinRX) can only receive, so the edge
server transmits with a second radio (a 2900/B200); UHD sees a 2900 as
``type=b200,master_clock_rate=20e6`` and the 2955 as ``type=x300,addr=...`` with
``master_clock_rate=200e6``; 5 or 10 MS/s work at both ends.
"""

from __future__ import annotations

import logging
import os

# UHD prints an INFO banner on first use; keep the console to warnings unless the user chose.
os.environ.setdefault("UHD_LOG_CONSOLE_LEVEL", "warning")

from gnuradio import gr  # noqa: E402
from gnuradio import uhd as _uhd  # noqa: E402

__all__ = [
    "B200_ARGS",
    "RadioNotFound",
    "X310_ARGS",
    "open_usrp_sink",
    "open_usrp_source",
    "usrp_rx",
    "usrp_tx",
]

logger = logging.getLogger(__name__)

B200_ARGS = "type=b200,master_clock_rate=20e6"  # USRP 2900
X310_ARGS = "type=x300,master_clock_rate=200e6"  # USRP 2955 (receive only: TwinRX)


class RadioNotFound(RuntimeError):  # noqa: N818 - the name users see in the one-line error
    """No USRP answered for the given device args."""

    def __init__(self, args: str, direction: str, detail: str = "") -> None:
        self.args = args
        self.direction = direction
        self.detail = detail
        super().__init__(f'no USRP found for device args "{args}" ({direction})')

    def line(self) -> str:
        """The one-line message printed when a program stops on this error."""
        return f"RadioNotFound: {self}"


def _fail(args: str, direction: str, exc: BaseException, exit_on_missing: bool) -> None:
    err = RadioNotFound(args, direction, str(exc).strip().splitlines()[0] if str(exc) else "")
    logger.debug("UHD said: %s", exc)
    if exit_on_missing:
        raise SystemExit(err.line()) from None
    raise err from exc


def open_usrp_sink(
    args: str,
    len_tag_key: str = "packet_len",
    channel: int = 0,
    exit_on_missing: bool = False,
):
    """A gr-uhd usrp_sink (fc32) in burst mode on ``len_tag_key``; RadioNotFound if absent."""
    try:
        return _uhd.usrp_sink(
            args, _uhd.stream_args(cpu_format="fc32", channels=[channel]), len_tag_key
        )
    except (RuntimeError, LookupError, KeyError) as exc:
        _fail(args, "TX", exc, exit_on_missing)


def open_usrp_source(args: str, channel: int = 0, exit_on_missing: bool = False):
    """A gr-uhd usrp_source (fc32); RadioNotFound if absent."""
    try:
        return _uhd.usrp_source(args, _uhd.stream_args(cpu_format="fc32", channels=[channel]))
    except (RuntimeError, LookupError, KeyError) as exc:
        _fail(args, "RX", exc, exit_on_missing)


def _configure(dev, samp_rate, freq, gain, antenna, subdev, clock_source, time_source, lo_offset):
    if subdev:
        dev.set_subdev_spec(subdev, 0)
    if clock_source:
        dev.set_clock_source(clock_source, 0)
    if time_source:
        dev.set_time_source(time_source, 0)
    dev.set_samp_rate(samp_rate)
    if lo_offset:
        dev.set_center_freq(_uhd.tune_request(freq, lo_offset), 0)
    else:
        dev.set_center_freq(freq, 0)
    dev.set_gain(gain, 0)
    if antenna:
        dev.set_antenna(antenna, 0)


class usrp_tx(gr.hier_block2):  # noqa: N801 - GNU Radio block naming
    """Complex bursts in -> USRP sink (bursts delimited by the ``len_tag_key`` tags)."""

    def __init__(
        self,
        args: str = B200_ARGS,
        samp_rate: float = 5e6,
        freq: float = 2.45e9,
        gain: float = 60.0,
        antenna: str = "TX/RX",
        subdev: str = "",
        clock_source: str = "",
        time_source: str = "",
        lo_offset: float = 0.0,
        len_tag_key: str = "packet_len",
        exit_on_missing: bool = False,
    ) -> None:
        gr.hier_block2.__init__(
            self, "usrp_tx", gr.io_signature(1, 1, gr.sizeof_gr_complex), gr.io_signature(0, 0, 0)
        )
        self.sink = open_usrp_sink(args, len_tag_key, exit_on_missing=exit_on_missing)
        _configure(
            self.sink, samp_rate, freq, gain, antenna, subdev, clock_source, time_source, lo_offset
        )
        self.connect(self, self.sink)


class usrp_rx(gr.hier_block2):  # noqa: N801 - GNU Radio block naming
    """USRP source -> complex samples out (continuous)."""

    def __init__(
        self,
        args: str = B200_ARGS,
        samp_rate: float = 5e6,
        freq: float = 2.45e9,
        gain: float = 30.0,
        antenna: str = "RX2",
        subdev: str = "",
        clock_source: str = "",
        time_source: str = "",
        lo_offset: float = 0.0,
        exit_on_missing: bool = False,
    ) -> None:
        gr.hier_block2.__init__(
            self, "usrp_rx", gr.io_signature(0, 0, 0), gr.io_signature(1, 1, gr.sizeof_gr_complex)
        )
        self.source = open_usrp_source(args, exit_on_missing=exit_on_missing)
        _configure(
            self.source,
            samp_rate,
            freq,
            gain,
            antenna,
            subdev,
            clock_source,
            time_source,
            lo_offset,
        )
        self.connect(self.source, self)
