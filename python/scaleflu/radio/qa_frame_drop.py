#!/usr/bin/env python3
"""gr_unittest QA of scaleflu.frame_drop: seeded drop fraction, ACKs spared on request."""

import pmt
from gnuradio import blocks, gr, gr_unittest

try:
    from gnuradio import scaleflu
except ImportError as exc:  # pragma: no cover - build problem, say so plainly
    raise SystemExit(f"cannot import gnuradio.scaleflu (is the module built?): {exc}") from exc


def frame_pdu(ftype: int, i: int):
    meta = pmt.dict_add(pmt.make_dict(), pmt.intern("type"), pmt.from_long(ftype))
    meta = pmt.dict_add(meta, pmt.intern("seq"), pmt.from_long(i))
    return pmt.cons(meta, pmt.init_u8vector(4, [i & 255, 1, 2, 3]))


def field(msg, key: str) -> int:
    return pmt.to_long(pmt.dict_ref(pmt.car(msg), pmt.intern(key), pmt.PMT_NIL))


class qa_frame_drop(gr_unittest.TestCase):  # noqa: N801 - GNU Radio QA naming
    def run_drop(self, drop, msgs):
        tb = gr.top_block()
        debug = blocks.message_debug()
        tb.msg_connect(drop, "out", debug, "store")
        for m in msgs:
            drop.to_basic_block()._post(pmt.intern("in"), m)
        drop.to_basic_block()._post(
            pmt.intern("system"), pmt.cons(pmt.intern("done"), pmt.from_long(1))
        )
        tb.run()
        return [debug.get_message(i) for i in range(debug.num_messages())]

    def test_fraction_and_seed(self):
        msgs = [frame_pdu(0, i) for i in range(2000)]
        d1 = scaleflu.frame_drop(0.2, seed=7)
        out1 = self.run_drop(d1, msgs)
        self.assertEqual(d1.dropped + d1.passed, 2000)
        self.assertEqual(len(out1), d1.passed)
        self.assertTrue(320 < d1.dropped < 480, d1.dropped)
        d2 = scaleflu.frame_drop(0.2, seed=7)
        out2 = self.run_drop(d2, msgs)
        seqs = lambda out: [field(m, "seq") for m in out]  # noqa: E731
        self.assertEqual(seqs(out1), seqs(out2))  # same seed, same drops

    def test_only_data_spares_acks(self):
        msgs = [frame_pdu(i % 2, i) for i in range(400)]
        d = scaleflu.frame_drop(1.0, seed=1, only_data=True)
        out = self.run_drop(d, msgs)
        self.assertEqual(len(out), 200)
        self.assertTrue(
            all(
                pmt.to_long(pmt.dict_ref(pmt.car(m), pmt.intern("type"), pmt.PMT_NIL)) == 1
                for m in out
            )
        )

    def test_bad_rate_refused(self):
        with self.assertRaises(ValueError):
            scaleflu.frame_drop(1.5)


if __name__ == "__main__":
    gr_unittest.run(qa_frame_drop)
