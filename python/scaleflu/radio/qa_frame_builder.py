#!/usr/bin/env python3
"""gr_unittest QA of scaleflu.frame_builder: PDUs in, CRC-protected tagged-stream frames out."""

import zlib

import pmt
from gnuradio import blocks, gr, gr_unittest

try:
    from gnuradio import scaleflu
except ImportError as exc:  # pragma: no cover - build problem, say so plainly
    raise SystemExit(f"cannot import gnuradio.scaleflu (is the module built?): {exc}") from exc


def pdu(payload: bytes, **meta: int):
    d = pmt.make_dict()
    for k, v in meta.items():
        d = pmt.dict_add(d, pmt.intern(k), pmt.from_long(v))
    return pmt.cons(d, pmt.init_u8vector(len(payload), list(payload)))


class qa_frame_builder(gr_unittest.TestCase):  # noqa: N801 - GNU Radio QA naming
    def setUp(self):
        self.tb = gr.top_block()

    def tearDown(self):
        self.tb = None

    def run_pdus(self, builder, msgs):
        """Post PDUs, stop the flowgraph with a 'done' message, return the sink."""
        sink = blocks.vector_sink_b()
        self.tb.connect(builder, sink)
        for m in msgs:
            builder.to_basic_block()._post(pmt.intern("in"), m)
        builder.to_basic_block()._post(
            pmt.intern("system"), pmt.cons(pmt.intern("done"), pmt.from_long(1))
        )
        self.tb.run()
        return sink

    def test_bad_parameters(self):
        with self.assertRaises(ValueError):
            scaleflu.frame_builder(mtu=20)
        with self.assertRaises(ValueError):
            scaleflu.frame_builder(src=70000)

    def test_frames_match_the_reference_layout(self):
        builder = scaleflu.frame_builder(mtu=1500, src=4, dst=9)
        payloads = [b"hello", bytes(range(256)) * 5, b""]
        msgs = [pdu(payloads[0], msg_id=77, seq=2, count=3), pdu(payloads[1]), pdu(payloads[2])]
        sink = self.run_pdus(builder, msgs)
        data = bytes(sink.data())
        tags = [t for t in sink.tags() if pmt.symbol_to_string(t.key) == "packet_len"]
        lengths = [pmt.to_long(t.value) for t in tags]
        self.assertEqual(lengths, [26 + len(p) for p in payloads])
        self.assertEqual([t.offset for t in tags], [0, lengths[0], lengths[0] + lengths[1]])
        off = 0
        for i, p in enumerate(payloads):
            frame = data[off : off + lengths[i]]
            off += lengths[i]
            self.assertEqual(frame[:3], b"SF\x01")
            self.assertEqual(int.from_bytes(frame[4:6], "big"), 4)
            self.assertEqual(int.from_bytes(frame[6:8], "big"), 9)
            self.assertEqual(frame[22 : 22 + len(p)], p)
            crc = int.from_bytes(frame[-4:], "big")
            self.assertEqual(crc, zlib.crc32(frame[:-4]))
        first = data[: lengths[0]]
        self.assertEqual(int.from_bytes(first[8:12], "big"), 77)
        self.assertEqual(int.from_bytes(first[12:16], "big"), 2)
        self.assertEqual(int.from_bytes(first[16:20], "big"), 3)
        # bare PDUs get consecutive automatic message ids and are one-fragment messages
        second = data[lengths[0] : lengths[0] + lengths[1]]
        third = data[lengths[0] + lengths[1] :]
        self.assertEqual(
            int.from_bytes(third[8:12], "big"), int.from_bytes(second[8:12], "big") + 1
        )
        self.assertEqual(int.from_bytes(second[16:20], "big"), 1)
        self.assertEqual(builder.frames_built(), 3)
        self.assertEqual(builder.frames_dropped(), 0)

    def test_oversize_and_malformed_pdus_are_dropped(self):
        builder = scaleflu.frame_builder(mtu=100)
        msgs = [
            pdu(bytes(74)),  # exactly mtu - 26: accepted
            pdu(bytes(75)),  # one byte too many
            pdu(b"x", seq=3, count=3),  # seq >= count
            pdu(b"x", src=-1),  # negative id
            pmt.intern("not a pdu"),
        ]
        sink = self.run_pdus(builder, msgs)
        self.assertEqual(len(sink.data()), 100)
        self.assertEqual(builder.frames_built(), 1)
        self.assertEqual(builder.frames_dropped(), 4)

    def test_raw_frames_pass_unchanged_and_bad_ones_are_dropped(self):
        from gnuradio.scaleflu import frame_build

        good = [frame_build(0, 4, 9, 77, i, 3, bytes([i]) * (10 + i)) for i in range(3)]
        ack = frame_build(1, 9, 4, 77, 0, 1, b"\x01" + bytes(10))
        corrupt = bytearray(good[0])
        corrupt[30] ^= 0x01  # payload bit flip: CRC mismatch
        long_frame = frame_build(0, 4, 9, 1, 0, 1, bytes(100))  # 126 B > mtu 120
        raw = pmt.dict_add(pmt.make_dict(), pmt.intern("raw"), pmt.PMT_T)

        def rpdu(frame):
            return pmt.cons(raw, pmt.init_u8vector(len(frame), list(frame)))

        builder = scaleflu.frame_builder(mtu=120, src=1, dst=2)
        msgs = [rpdu(good[0]), rpdu(bytes(corrupt)), rpdu(ack), rpdu(long_frame)]
        msgs += [rpdu(good[1][:-1]), rpdu(good[1]), rpdu(good[2])]
        sink = self.run_pdus(builder, msgs)
        # the good frames come out byte for byte, src/dst/msg_id untouched by the defaults
        self.assertEqual(bytes(sink.data()), good[0] + ack + good[1] + good[2])
        tags = [t for t in sink.tags() if pmt.symbol_to_string(t.key) == "packet_len"]
        self.assertEqual(
            [pmt.to_long(t.value) for t in tags],
            [len(good[0]), len(ack), len(good[1]), len(good[2])],
        )
        self.assertEqual(builder.frames_built(), 4)
        self.assertEqual(builder.frames_dropped(), 3)

    def test_cpp_codec_equals_python_crc(self):
        from gnuradio.scaleflu import frame_build, frame_crc32, frame_parse

        self.assertEqual(frame_crc32(b"123456789"), 0xCBF43926)
        f = frame_build(0, 1, 2, 3, 4, 5, b"abc")
        self.assertEqual(frame_crc32(f[:-4]), zlib.crc32(f[:-4]))
        parsed = frame_parse(f)
        self.assertEqual(parsed["payload"], b"abc")
        self.assertEqual((parsed["seq"], parsed["count"]), (4, 5))
        self.assertEqual(frame_parse(f[:-1] + bytes([f[-1] ^ 1])), "crc mismatch")
        with self.assertRaises(ValueError):
            frame_build(0, 1, 2, 3, 5, 5, b"")


if __name__ == "__main__":
    gr_unittest.run(qa_frame_builder)
