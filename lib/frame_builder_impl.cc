/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#include "frame_builder_impl.h"
#include "pdu_frame.h"
#include <gnuradio/io_signature.h>
#include <cstring>
#include <stdexcept>

namespace gr {
namespace scaleflu {

namespace {
const pmt::pmt_t PORT_IN = pmt::mp("in");
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
        std::string error;
        if (detail::pdu_to_frame(msg, d_mtu, d_src, d_dst, d_next_msg_id, d_frame, error))
            return true;
        d_logger->error("{:s}", error);
        d_dropped++;
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
