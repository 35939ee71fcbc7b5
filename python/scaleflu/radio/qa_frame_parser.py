#!/usr/bin/env python3
"""gr_unittest QA of scaleflu.frame_parser: CRC check, header parsing, hostile input."""

import random

import pmt
from gnuradio import blocks, gr, gr_unittest

try:
    from gnuradio import scaleflu
except ImportError as exc:  # pragma: no cover - build problem, say so plainly
    raise SystemExit(f"cannot import gnuradio.scaleflu (is the module built?): {exc}") from exc


def raw_pdu(data: bytes):
    return pmt.cons(pmt.make_dict(), pmt.init_u8vector(len(data), list(data)))


class qa_frame_parser(gr_unittest.TestCase):  # noqa: N801 - GNU Radio QA naming
    def setUp(self):
        self.tb = gr.top_block()

    def tearDown(self):
        self.tb = None

    def run_frames(self, parser, msgs):
        debug = blocks.message_debug()
        self.tb.msg_connect(parser, "out", debug, "store")
        for m in msgs:
            parser.to_basic_block()._post(pmt.intern("in"), m)
        parser.to_basic_block()._post(
            pmt.intern("system"), pmt.cons(pmt.intern("done"), pmt.from_long(1))
        )
        self.tb.run()
        return [debug.get_message(i) for i in range(debug.num_messages())]

    def test_good_frames_parsed_bad_ones_counted(self):
        good = scaleflu.frame_build(0, 7, 3, 1234, 5, 9, b"tensor bytes")
        flipped = bytearray(good)
        flipped[25] ^= 0x10
        other_node = scaleflu.frame_build(0, 7, 4, 1, 0, 1, b"not for me")
        bcast = scaleflu.frame_build(1, 0, 65535, 2, 0, 1, b"ack")
        parser = scaleflu.frame_parser(node_id=3)
        out = self.run_frames(
            parser,
            [
                raw_pdu(good),
                raw_pdu(bytes(flipped)),
                raw_pdu(b"SF\x01"),
                raw_pdu(other_node),
                raw_pdu(bcast),
                pmt.intern("junk"),
            ],
        )
        self.assertEqual(len(out), 2)
        meta, vec = pmt.car(out[0]), pmt.cdr(out[0])
        self.assertEqual(bytes(pmt.u8vector_elements(vec)), b"tensor bytes")
        field = lambda k: pmt.to_long(pmt.dict_ref(meta, pmt.intern(k), pmt.PMT_NIL))  # noqa: E731
        self.assertEqual(
            [field(k) for k in ("type", "src", "dst", "msg_id", "seq", "count")],
            [0, 7, 3, 1234, 5, 9],
        )
        self.assertEqual(parser.frames_ok(), 2)
        self.assertEqual(parser.crc_errors(), 1)
        self.assertEqual(parser.malformed(), 2)
        self.assertEqual(parser.filtered(), 1)

    def test_random_bytes_never_crash_or_pass(self):
        rng = random.Random(7)
        msgs = []
        for i in range(3000):
            data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 200)))
            if i % 2 and len(data) >= 3:
                data = b"SF\x01" + data[3:]
            msgs.append(raw_pdu(data))
        parser = scaleflu.frame_parser()
        out = self.run_frames(parser, msgs)
        self.assertEqual(out, [])
        self.assertEqual(parser.frames_ok(), 0)
        self.assertEqual(parser.crc_errors() + parser.malformed(), 3000)


class qa_frame_parser_raw(gr_unittest.TestCase):  # noqa: N801 - GNU Radio QA naming
    def test_raw_output_forwards_whole_frames(self):
        from gnuradio.scaleflu import frame_build

        tb = gr.top_block()
        parser = scaleflu.frame_parser(node_id=3)
        self.assertFalse(parser.raw_output())
        parser.set_raw_output(True)
        self.assertTrue(parser.raw_output())
        sink = blocks.message_debug()
        tb.msg_connect(parser, "out", sink, "store")
        ok = frame_build(0, 5, 3, 11, 1, 2, b"payload")
        bad = bytearray(ok)
        bad[25] ^= 0x80
        other = frame_build(0, 5, 4, 11, 1, 2, b"payload")  # for node 4
        for f in (ok, bytes(bad), other):
            parser.to_basic_block()._post(
                pmt.intern("in"), pmt.cons(pmt.make_dict(), pmt.init_u8vector(len(f), list(f)))
            )
        parser.to_basic_block()._post(
            pmt.intern("system"), pmt.cons(pmt.intern("done"), pmt.from_long(1))
        )
        tb.run()
        self.assertEqual(sink.num_messages(), 1)
        msg = sink.get_message(0)
        meta = pmt.car(msg)
        self.assertEqual(bytes(pmt.u8vector_elements(pmt.cdr(msg))), ok)
        self.assertTrue(pmt.equal(pmt.dict_ref(meta, pmt.intern("raw"), pmt.PMT_F), pmt.PMT_T))
        for key, want in (("type", 0), ("src", 5), ("dst", 3), ("msg_id", 11), ("seq", 1)):
            self.assertEqual(pmt.to_long(pmt.dict_ref(meta, pmt.intern(key), pmt.PMT_NIL)), want)
        self.assertEqual((parser.frames_ok(), parser.crc_errors(), parser.filtered()), (1, 1, 1))


if __name__ == "__main__":
    gr_unittest.run(qa_frame_parser)
