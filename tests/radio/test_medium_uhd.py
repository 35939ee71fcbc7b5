"""UHD TX path on one frequency: clean bursts (tx_sob/tx_eob) up to the device open."""

from __future__ import annotations

import time

import numpy as np
import pmt
import pytest
from gnuradio import blocks, gr

from scaleflu.radio import uhd
from scaleflu.radio.ofdm import samples_per_frame
from scaleflu.radio.phy import PhyConfig

pytestmark = [pytest.mark.gnuradio, pytest.mark.timeout(120)]


def _post(tx, n_bytes: int, k: int) -> None:
    for i in range(k):
        data = np.full(n_bytes, i, np.uint8)
        tx.framer.to_basic_block()._post(
            pmt.intern("in"), pmt.cons(pmt.make_dict(), pmt.init_u8vector(len(data), data))
        )


def _run(tb, sink_len, want: int) -> None:
    tb.start()
    end = time.monotonic() + 20
    while sink_len() < want and time.monotonic() < end:
        time.sleep(0.01)
    tb.stop()
    tb.wait()


def test_burst_tagger_marks_each_frame_start_and_end():
    phy = PhyConfig()
    tx = phy.tx(1)
    tagger = uhd.burst_tagger()
    sink = blocks.vector_sink_c()
    tb = gr.top_block()
    tb.connect(tx, tagger, sink)
    sizes = (100, 700, 1474)
    for s in sizes:
        _post(tx, s, 1)
    spf = [samples_per_frame(s + 26) for s in sizes]
    _run(tb, lambda: len(sink.data()), sum(spf))
    tags = sorted((t.offset, pmt.symbol_to_string(t.key)) for t in sink.tags())
    keys = {k for _, k in tags}
    assert keys == {"tx_sob", "tx_eob"}  # the length tags are gone
    sob = [o for o, k in tags if k == "tx_sob"]
    eob = [o for o, k in tags if k == "tx_eob"]
    starts = np.cumsum([0, *spf[:-1]]).tolist()
    assert sob == starts
    assert eob == [s + n - 1 for s, n in zip(starts, spf, strict=True)]
    x = np.asarray(sink.data())
    assert len(x) == sum(spf)
    assert tagger.bursts == 3
    # each burst ends in its zero padding, so the radio's last sample before EOB is silent
    assert all(x[e] == 0 for e in eob)


class _FakeUsrpSink(gr.sync_block):
    """Stands in for gr-uhd's usrp_sink: records configuration calls and the tags it gets."""

    made: list[_FakeUsrpSink] = []

    def __init__(self, args, stream_args, len_tag_key=""):
        gr.sync_block.__init__(self, "fake_usrp_sink", [np.complex64], None)
        self.args, self.len_tag_key = args, len_tag_key
        self.calls: dict[str, tuple] = {}
        self.tags: list[tuple[int, str]] = []
        self.n = 0
        _FakeUsrpSink.made.append(self)

    def work(self, input_items, output_items):  # noqa: D102
        k = len(input_items[0])
        for t in self.get_tags_in_window(0, 0, k):
            self.tags.append((t.offset, pmt.symbol_to_string(t.key)))
        self.n += k
        return k

    def set_samp_rate(self, *a):
        self.calls["set_samp_rate"] = a

    def set_center_freq(self, *a):
        self.calls["set_center_freq"] = a

    def set_gain(self, *a):
        self.calls["set_gain"] = a

    def set_antenna(self, *a):
        self.calls["set_antenna"] = a


def test_usrp_tx_opens_the_sink_for_burst_tags_on_one_frequency(monkeypatch):
    _FakeUsrpSink.made.clear()
    monkeypatch.setattr(uhd._uhd, "usrp_sink", _FakeUsrpSink)
    phy = PhyConfig()
    tx = phy.tx(2)
    dev = uhd.usrp_tx("type=b200", samp_rate=5e6, gain=50)
    fake = _FakeUsrpSink.made[-1]
    assert fake.len_tag_key == ""  # burst mode comes from tx_sob/tx_eob, not length tags
    assert fake.calls["set_center_freq"] == (uhd.DEFAULT_FREQ, 0)
    assert fake.calls["set_samp_rate"] == (5e6,)
    assert fake.calls["set_gain"] == (50, 0)
    tb = gr.top_block()
    tb.connect(tx, dev)
    _post(tx, 500, 2)
    want = 2 * samples_per_frame(526)
    _run(tb, lambda: fake.n, want)
    assert [k for _, k in sorted(fake.tags)] == ["tx_sob", "tx_eob", "tx_sob", "tx_eob"]
    # the receive side defaults to the same frequency: server and robots share one channel
    import inspect

    assert inspect.signature(uhd.usrp_rx).parameters["freq"].default == uhd.DEFAULT_FREQ


def test_usrp_tx_without_a_radio_is_one_clear_error():
    with pytest.raises(
        uhd.RadioNotFound, match=r'no USRP found for device args "type=b200" \(TX\)'
    ):
        uhd.usrp_tx("type=b200")


GRC_DIR = __import__("pathlib").Path(__file__).resolve().parents[2] / "grc"


def test_shared_medium_flowgraphs_compile_and_deliver(tmp_path):
    """grc/server_shared_medium.grc and robot_shared_medium.grc: one frequency, via the broker."""
    import os
    import shutil
    import subprocess
    import sys

    from scaleflu.radio.medium import LinkChannel, MediumBroker, MediumConfig

    if shutil.which("grcc") is None:
        pytest.skip("grcc not installed")
    env = dict(os.environ, GRC_BLOCKS_PATH=str(GRC_DIR), GR_DONT_LOAD_PREFS="1")
    for name in ("server_shared_medium", "robot_shared_medium"):
        r = subprocess.run(
            ["grcc", "-o", str(tmp_path), str(GRC_DIR / f"{name}.grc")],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    cfg = MediumConfig(
        nodes=(0, 1),
        address="tcp://127.0.0.1:0",
        seed=1,
        default=LinkChannel(snr_db=20.0, fading="rician"),
    )
    with MediumBroker(cfg).start() as br:
        code = (
            f"import sys, time; sys.path.insert(0, {str(tmp_path)!r})\n"
            "from server_shared_medium import server_shared_medium as S\n"
            "from robot_shared_medium import robot_shared_medium as R\n"
            f"s = S(broker={br.address!r}); r = R(broker={br.address!r})\n"
            "s.start(); r.start(); end = time.time() + 40\n"
            "while s.delivered.num_messages() < 1 and time.time() < end: time.sleep(0.05)\n"
            "n = s.delivered.num_messages(); r.stop(); s.stop(); r.wait(); s.wait()\n"
            "print('DELIVERED', n, flush=True)\n"
            "import os; os._exit(0)\n"
        )
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=90
        )
        # the robot's strobe sends the same message every 5 s: under CPU load a second copy may
        # be delivered before the poll loop above sees the first
        got = [ln for ln in r.stdout.splitlines() if ln.startswith("DELIVERED ")]
        assert got and int(got[-1].split()[1]) >= 1, r.stdout[-1500:] + r.stderr[-2000:]
        assert br.stats()["airtime_samples"]["1"] > 0
    # without a broker: one line and exit status 1
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from robot_shared_medium import robot_shared_medium as R\n"
        "R(broker='tcp://127.0.0.1:9', broker_timeout=2.0)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=90
    )
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "MediumError: no answer from the medium broker at tcp://127.0.0.1:9 in 2 s"
    )
    assert "python -m scaleflu.cli.medium --address tcp://127.0.0.1:9" in last  # how to start it
