/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#include "frame_builder_impl.h"
#include <gnuradio/io_signature.h>
#include <cstring>
#include <stdexcept>

namespace gr {
namespace scaleflu {

namespace {
const pmt::pmt_t PORT_IN = pmt::mp("in");
const pmt::pmt_t KEY_RAW = pmt::mp("raw");

// Read an integer metadata field; false when present but not an integer in [0, max].
bool meta_uint(const pmt::pmt_t& meta, const char* key, uint64_t max, uint64_t& value)
{
    const pmt::pmt_t v = pmt::dict_ref(meta, pmt::mp(key), pmt::PMT_NIL);
    if (pmt::is_null(v))
        return true; // absent: keep the default
    if (!pmt::is_integer(v) && !pmt::is_uint64(v))
        return false;
    const int64_t x = pmt::is_uint64(v) ? int64_t(pmt::to_uint64(v)) : pmt::to_long(v);
    if (x < 0 || uint64_t(x) > max)
        return false;
    value = uint64_t(x);
    return true;
}
} // namespace

frame_builder::sptr frame_builder::make(int mtu, int src, int dst, const std::string& key)
{
    return gnuradio::make_block_sptr<frame_builder_impl>(mtu, src, dst, key);
}

frame_builder_impl::frame_builder_impl(int mtu, int src, int dst, const std::string& key)
    : gr::tagged_stream_block("frame_builder",
                              gr::io_signature::make(0, 0, 0),
                              gr::io_signature::make(1, 1, sizeof(uint8_t)),
                              key),
      d_mtu(size_t(mtu)),
      d_src(uint16_t(src)),
      d_dst(uint16_t(dst))
{
    if (mtu < int(frame::OVERHEAD + 1) || mtu > int(65535 + frame::OVERHEAD))
        throw std::invalid_argument("frame_builder: mtu must be in [27, 65561], got " +
                                    std::to_string(mtu));
    if (src < 0 || src > 0xFFFF || dst < 0 || dst > 0xFFFF)
        throw std::invalid_argument("frame_builder: src and dst must be in [0, 65535]");
    message_port_register_in(PORT_IN);
    // The output buffer must hold one whole frame.
    set_min_output_buffer(0, std::max<long>(mtu * 2, 4096));
}

bool frame_builder_impl::take_next_pdu()
{
    while (true) {
        pmt::pmt_t msg(delete_head_nowait(PORT_IN));
        if (msg.get() == nullptr)
            return false;
        if (!pmt::is_pdu(msg)) {
            d_logger->error("dropping a message that is not a u8 PDU");
            d_dropped++;
            continue;
        }
        const pmt::pmt_t meta = pmt::car(msg);
        const pmt::pmt_t vec = pmt::cdr(msg);
        if (!pmt::is_u8vector(vec)) {
            d_logger->error("dropping a PDU whose data is not a u8vector");
            d_dropped++;
            continue;
        }
        frame::header h;
        if (pmt::is_dict(meta) && pmt::eq(pmt::dict_ref(meta, KEY_RAW, pmt::PMT_F), pmt::PMT_T)) {
            // an encoded frame: check it as a receiver would and pass it on unchanged
            size_t len = 0;
            const uint8_t* data = pmt::u8vector_elements(vec, len);
            const uint8_t* payload = nullptr;
            size_t plen = 0;
            const frame::parse_status st = frame::parse(data, len, h, payload, plen, d_mtu);
            if (st != frame::parse_status::OK) {
                d_logger->error("dropping raw frame PDU: {:s} ({:d} B)",
                                frame::status_name(st),
                                len);
                d_dropped++;
                continue;
            }
            d_frame.assign(data, data + len);
            return true;
        }
        uint64_t type = 0, src = d_src, dst = d_dst, msg_id = d_next_msg_id, seq = 0,
                 count = 1;
        const bool is_dict = pmt::is_dict(meta);
        if (is_dict && !(meta_uint(meta, "type", 255, type) &&
                         meta_uint(meta, "src", 0xFFFF, src) &&
                         meta_uint(meta, "dst", 0xFFFF, dst) &&
                         meta_uint(meta, "msg_id", 0xFFFFFFFFu, msg_id) &&
                         meta_uint(meta, "seq", 0xFFFFFFFFu, seq) &&
                         meta_uint(meta, "count", 0xFFFFFFFFu, count))) {
            d_logger->error("dropping a PDU with a malformed header field in its metadata");
            d_dropped++;
            continue;
        }
        h.type = uint8_t(type);
        h.src = uint16_t(src);
        h.dst = uint16_t(dst);
        h.msg_id = uint32_t(msg_id);
        h.seq = uint32_t(seq);
        h.count = uint32_t(count);
        size_t len = 0;
        const uint8_t* data = pmt::u8vector_elements(vec, len);
        try {
            d_frame = frame::build(h, data, len, d_mtu);
        } catch (const std::invalid_argument& e) {
            d_logger->error("dropping PDU: {:s}", e.what());
            d_dropped++;
            continue;
        }
        if (!is_dict || pmt::is_null(pmt::dict_ref(meta, pmt::mp("msg_id"), pmt::PMT_NIL)))
            d_next_msg_id++;
        return true;
    }
}

int frame_builder_impl::calculate_output_stream_length(const gr_vector_int&)
{
    if (d_frame.empty() && !take_next_pdu())
        return 0;
    return int(d_frame.size());
}

int frame_builder_impl::work(int noutput_items,
                             gr_vector_int&,
                             gr_vector_const_void_star&,
                             gr_vector_void_star& output_items)
{
    if (d_frame.empty() || size_t(noutput_items) < d_frame.size())
        return 0;
    auto* out = static_cast<uint8_t*>(output_items[0]);
    std::memcpy(out, d_frame.data(), d_frame.size());
    const int n = int(d_frame.size());
    d_frame.clear();
    d_built++;
    return n;
}

} /* namespace scaleflu */
} /* namespace gr */
