"""UHD front ends of the OFDM link with a clear error when no radio answers.

``usrp_tx`` (complex in -> ``burst_tagger`` -> USRP sink: each "packet_len" packet of
ofdm_link_tx, i.e. one OFDM burst and its trailing zeros, becomes one clean UHD burst with a
``tx_sob`` tag on its first sample and ``tx_eob`` on its last, so the radio transmits nothing
between frames and a half-duplex front end goes back to receive) and
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

import numpy as np  # noqa: E402
import pmt  # noqa: E402
from gnuradio import gr  # noqa: E402
from gnuradio import uhd as _uhd  # noqa: E402

__all__ = [
    "B200_ARGS",
    "DEFAULT_FREQ",
    "burst_tagger",
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
DEFAULT_FREQ = 2.45e9  # server and robots share one frequency unless told otherwise


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


class burst_tagger(gr.sync_block):  # noqa: N801 - GNU Radio block naming
    """Complex in -> complex out: ``len_tag_key`` packets become tx_sob ... tx_eob bursts.

    The samples pass unchanged (one copy per call, no per-sample Python); the length tags are
    replaced by a ``tx_sob`` tag (True) on each packet's first sample and a ``tx_eob`` tag
    (True) on its last, which is what gr-uhd's usrp_sink expects for burst transmission when it
    is opened without a length tag. ``bursts`` counts the bursts tagged.
    """

    def __init__(self, len_tag_key: str = "packet_len") -> None:
        gr.sync_block.__init__(self, "burst_tagger", [np.complex64], [np.complex64])
        self._key = pmt.intern(len_tag_key)
        self._sob = pmt.intern("tx_sob")
        self._eob = pmt.intern("tx_eob")
        self._src = pmt.intern(self.name())
        self._eob_due: list[int] = []  # absolute offsets of pending end-of-burst tags
        self.bursts = 0
        self.set_tag_propagation_policy(gr.TPP_DONT)

    def work(self, input_items, output_items):  # noqa: D102
        x, y = input_items[0], output_items[0]
        n = len(y)
        y[:] = x[:n]
        start = self.nitems_read(0)
        for tag in self.get_tags_in_window(0, 0, n, self._key):
            length = int(pmt.to_long(tag.value))
            if length <= 0:
                continue
            self.add_item_tag(0, tag.offset, self._sob, pmt.PMT_T, self._src)
            self._eob_due.append(tag.offset + length - 1)
            self.bursts += 1
        keep = []
        for off in self._eob_due:
            if off < start + n:
                self.add_item_tag(0, off, self._eob, pmt.PMT_T, self._src)
            else:
                keep.append(off)
        self._eob_due = keep
        return n


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
    """Complex bursts in -> burst_tagger -> USRP sink (one UHD burst per ``len_tag_key`` packet).

    ``burst_tags=False`` gives the sink the length tags instead (gr-uhd's tagged-stream mode).
    """

    def __init__(
        self,
        args: str = B200_ARGS,
        samp_rate: float = 5e6,
        freq: float = DEFAULT_FREQ,
        gain: float = 60.0,
        antenna: str = "TX/RX",
        subdev: str = "",
        clock_source: str = "",
        time_source: str = "",
        lo_offset: float = 0.0,
        len_tag_key: str = "packet_len",
        exit_on_missing: bool = False,
        burst_tags: bool = True,
    ) -> None:
        gr.hier_block2.__init__(
            self, "usrp_tx", gr.io_signature(1, 1, gr.sizeof_gr_complex), gr.io_signature(0, 0, 0)
        )
        sink_key = "" if burst_tags else len_tag_key
        self.sink = open_usrp_sink(args, sink_key, exit_on_missing=exit_on_missing)
        _configure(
            self.sink, samp_rate, freq, gain, antenna, subdev, clock_source, time_source, lo_offset
        )
        if burst_tags:
            self.tagger = burst_tagger(len_tag_key)
            self.connect(self, self.tagger, self.sink)
        else:
            self.tagger = None
            self.connect(self, self.sink)


class usrp_rx(gr.hier_block2):  # noqa: N801 - GNU Radio block naming
    """USRP source -> complex samples out (continuous)."""

    def __init__(
        self,
        args: str = B200_ARGS,
        samp_rate: float = 5e6,
        freq: float = DEFAULT_FREQ,
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
