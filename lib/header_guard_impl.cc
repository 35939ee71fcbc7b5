/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#include "header_guard_impl.h"
#include <gnuradio/io_signature.h>
#include <stdexcept>

namespace gr {
namespace scaleflu {

namespace {
const pmt::pmt_t PORT_IN = pmt::mp("in");
const pmt::pmt_t PORT_OUT = pmt::mp("out");
} // namespace

header_guard::sptr header_guard::make(int max_packet_len, const std::string& len_tag_key)
{
    return gnuradio::make_block_sptr<header_guard_impl>(max_packet_len, len_tag_key);
}

header_guard_impl::header_guard_impl(int max_packet_len, const std::string& len_tag_key)
    : gr::block("header_guard", gr::io_signature::make(0, 0, 0), gr::io_signature::make(0, 0, 0)),
      d_max(max_packet_len),
      d_key(pmt::mp(len_tag_key))
{
    if (max_packet_len < 1)
        throw std::invalid_argument("header_guard: max_packet_len must be >= 1");
    message_port_register_in(PORT_IN);
    message_port_register_out(PORT_OUT);
    set_msg_handler(PORT_IN, [this](const pmt::pmt_t& msg) { handle(msg); });
}

void header_guard_impl::handle(const pmt::pmt_t& msg)
{
    if (pmt::is_dict(msg)) {
        const pmt::pmt_t n = pmt::dict_ref(msg, d_key, pmt::PMT_NIL);
        if (!pmt::is_integer(n) || pmt::to_long(n) < 0 || pmt::to_long(n) > d_max) {
            d_rejected++;
            message_port_pub(PORT_OUT, pmt::PMT_F);
            return;
        }
        d_passed++;
    }
    message_port_pub(PORT_OUT, msg);
}

} /* namespace scaleflu */
} /* namespace gr */
