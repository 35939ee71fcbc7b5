/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#include "frame_parser_impl.h"
#include <gnuradio/io_signature.h>
#include <gnuradio/scaleflu/frame_format.h>
#include <stdexcept>

namespace gr {
namespace scaleflu {

namespace {
const pmt::pmt_t PORT_IN = pmt::mp("in");
const pmt::pmt_t PORT_OUT = pmt::mp("out");
const pmt::pmt_t KEY_RAW = pmt::mp("raw");
} // namespace

frame_parser::sptr frame_parser::make(int node_id, int mtu)
{
    return gnuradio::make_block_sptr<frame_parser_impl>(node_id, mtu);
}

frame_parser_impl::frame_parser_impl(int node_id, int mtu)
    : gr::block("frame_parser", gr::io_signature::make(0, 0, 0), gr::io_signature::make(0, 0, 0)),
      d_node_id(node_id),
      d_mtu(size_t(mtu < 0 ? 0 : mtu))
{
    if (node_id < -1 || node_id > 0xFFFF)
        throw std::invalid_argument("frame_parser: node_id must be -1 or in [0, 65535]");
    if (mtu < int(frame::OVERHEAD + 1) || mtu > int(frame::OVERHEAD + 0xFFFF))
        throw std::invalid_argument("frame_parser: mtu must be in [27, 65561]");
    message_port_register_in(PORT_IN);
    message_port_register_out(PORT_OUT);
    set_msg_handler(PORT_IN, [this](const pmt::pmt_t& msg) { handle(msg); });
}

void frame_parser_impl::handle(const pmt::pmt_t& msg)
{
    if (!pmt::is_pair(msg) || !pmt::is_u8vector(pmt::cdr(msg))) {
        d_malformed++;
        d_logger->debug("dropping a message that is not a u8 PDU");
        return;
    }
    size_t len = 0;
    const uint8_t* buf = pmt::u8vector_elements(pmt::cdr(msg), len);
    frame::header h;
    const uint8_t* payload = nullptr;
    size_t plen = 0;
    const frame::parse_status st = frame::parse(buf, len, h, payload, plen, d_mtu);
    if (st == frame::parse_status::CRC_MISMATCH) {
        d_crc++;
        d_logger->debug("dropping frame: crc mismatch ({:d} B)", len);
        return;
    }
    if (st != frame::parse_status::OK) {
        d_malformed++;
        d_logger->debug("dropping frame: {:s} ({:d} B)", frame::status_name(st), len);
        return;
    }
    if (d_node_id >= 0 && h.dst != frame::BROADCAST && h.dst != uint16_t(d_node_id)) {
        d_filtered++;
        return;
    }
    pmt::pmt_t meta = pmt::make_dict();
    meta = pmt::dict_add(meta, pmt::mp("type"), pmt::from_long(h.type));
    meta = pmt::dict_add(meta, pmt::mp("src"), pmt::from_long(h.src));
    meta = pmt::dict_add(meta, pmt::mp("dst"), pmt::from_long(h.dst));
    meta = pmt::dict_add(meta, pmt::mp("msg_id"), pmt::from_long(h.msg_id));
    meta = pmt::dict_add(meta, pmt::mp("seq"), pmt::from_long(h.seq));
    meta = pmt::dict_add(meta, pmt::mp("count"), pmt::from_long(h.count));
    // Keep metadata the receive chain attached (e.g. SNR estimates from ofdm_rx).
    if (pmt::is_dict(pmt::car(msg)))
        meta = pmt::dict_update(pmt::car(msg), meta);
    d_ok++;
    if (d_raw) { // the whole frame, as received and checked: forwarded, not copied
        meta = pmt::dict_add(meta, KEY_RAW, pmt::PMT_T);
        message_port_pub(PORT_OUT, pmt::cons(meta, pmt::cdr(msg)));
        return;
    }
    message_port_pub(PORT_OUT, pmt::cons(meta, pmt::init_u8vector(plen, payload)));
}

} /* namespace scaleflu */
} /* namespace gr */
