#!/usr/bin/env python3
"""gr_unittest QA of scaleflu.header_guard: oversized or malformed OFDM headers become #f."""

import pmt
from gnuradio import blocks, gr, gr_unittest

try:
    from gnuradio import scaleflu
except ImportError as exc:  # pragma: no cover - build problem, say so plainly
    raise SystemExit(f"cannot import gnuradio.scaleflu (is the module built?): {exc}") from exc


def header(n):
    d = pmt.dict_add(pmt.make_dict(), pmt.intern("frame_len"), pmt.from_long(10))
    return pmt.dict_add(d, pmt.intern("packet_len"), n)


class qa_header_guard(gr_unittest.TestCase):  # noqa: N801 - GNU Radio QA naming
    def test_guard(self):
        tb = gr.top_block()
        guard = scaleflu.header_guard(6016)
        debug = blocks.message_debug()
        tb.msg_connect(guard, "out", debug, "store")
        msgs = [
            header(pmt.from_long(6016)),
            header(pmt.from_long(6017)),
            header(pmt.from_long(-1)),
            header(pmt.intern("x")),
            pmt.make_dict(),
            pmt.PMT_F,
        ]
        for m in msgs:
            guard.to_basic_block()._post(pmt.intern("in"), m)
        guard.to_basic_block()._post(
            pmt.intern("system"), pmt.cons(pmt.intern("done"), pmt.from_long(1))
        )
        tb.run()
        got = [debug.get_message(i) for i in range(debug.num_messages())]
        self.assertEqual(len(got), 6)
        self.assertTrue(pmt.equal(got[0], msgs[0]))
        for m in got[1:]:
            self.assertTrue(pmt.eq(m, pmt.PMT_F))
        self.assertEqual(guard.passed(), 1)
        self.assertEqual(guard.rejected(), 4)  # the bare F passes through unchanged, uncounted


if __name__ == "__main__":
    gr_unittest.run(qa_header_guard)
