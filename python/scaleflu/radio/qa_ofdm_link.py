#!/usr/bin/env python3
"""gr_unittest QA of the OFDM link hier blocks: frames across TX -> channel -> RX, last one too."""

import random
import time

import pmt
from gnuradio import blocks, channels, gr, gr_unittest

try:
    from gnuradio import scaleflu
except ImportError as exc:  # pragma: no cover - build problem, say so plainly
    raise SystemExit(f"cannot import gnuradio.scaleflu (is the module built?): {exc}") from exc


class qa_ofdm_link(gr_unittest.TestCase):  # noqa: N801 - GNU Radio QA naming
    def test_frames_cross_channel_including_last(self):
        tb = gr.top_block()
        tx = scaleflu.ofdm_link_tx(mtu=1500, src=4)
        rx = scaleflu.ofdm_link_rx(node_id=-1)
        chan = channels.channel_model(
            noise_voltage=0.5, frequency_offset=0.001, taps=[1.0, 0.2j], noise_seed=1
        )
        debug = blocks.message_debug()
        tb.connect(tx, chan, rx)
        tb.msg_connect(rx, "out", debug, "store")
        rng = random.Random(3)
        payloads = [
            bytes(rng.getrandbits(8) for _ in range(rng.choice((10, 700, 1474)))) for _ in range(30)
        ]
        tb.start()
        for i, p in enumerate(payloads):
            meta = pmt.dict_add(pmt.make_dict(), pmt.intern("seq"), pmt.from_long(i))
            meta = pmt.dict_add(meta, pmt.intern("count"), pmt.from_long(len(payloads)))
            tx.framer.to_basic_block()._post(
                pmt.intern("in"), pmt.cons(meta, pmt.init_u8vector(len(p), list(p)))
            )
        end = time.monotonic() + 15
        while debug.num_messages() < len(payloads) and time.monotonic() < end:
            time.sleep(0.01)
        tb.stop()
        tb.wait()
        got = [debug.get_message(i) for i in range(debug.num_messages())]
        # SNR ~29 dB: every frame, the last one included (flushed by the trailing zeros)
        self.assertEqual(len(got), len(payloads))
        for i, m in enumerate(got):
            self.assertEqual(bytes(pmt.u8vector_elements(pmt.cdr(m))), payloads[i])
            meta = pmt.car(m)
            self.assertEqual(pmt.to_long(pmt.dict_ref(meta, pmt.intern("src"), pmt.PMT_NIL)), 4)
        self.assertEqual(rx.crc_errors(), 0)
        self.assertEqual(tx.frames_built(), len(payloads))


if __name__ == "__main__":
    gr_unittest.run(qa_ofdm_link)
