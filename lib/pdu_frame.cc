/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#include "pdu_frame.h"
#include <stdexcept>

namespace gr {
namespace scaleflu {
namespace detail {

namespace {
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

bool pdu_to_frame(const pmt::pmt_t& msg,
                  size_t mtu,
                  uint16_t src_default,
                  uint16_t dst_default,
                  uint32_t& next_msg_id,
                  std::vector<uint8_t>& out,
                  std::string& error)
{
    if (!pmt::is_pdu(msg)) {
        error = "dropping a message that is not a u8 PDU";
        return false;
    }
    const pmt::pmt_t meta = pmt::car(msg);
    const pmt::pmt_t vec = pmt::cdr(msg);
    if (!pmt::is_u8vector(vec)) {
        error = "dropping a PDU whose data is not a u8vector";
        return false;
    }
    frame::header h;
    size_t len = 0;
    const uint8_t* data = pmt::u8vector_elements(vec, len);
    if (pmt::is_dict(meta) && pmt::eq(pmt::dict_ref(meta, KEY_RAW, pmt::PMT_F), pmt::PMT_T)) {
        // an encoded frame: check it as a receiver would and pass it on unchanged
        const uint8_t* payload = nullptr;
        size_t plen = 0;
        const frame::parse_status st = frame::parse(data, len, h, payload, plen, mtu);
        if (st != frame::parse_status::OK) {
            error = "dropping raw frame PDU: " + std::string(frame::status_name(st)) + " (" +
                    std::to_string(len) + " B)";
            return false;
        }
        out.assign(data, data + len);
        return true;
    }
    uint64_t type = 0, src = src_default, dst = dst_default, msg_id = next_msg_id, seq = 0,
             count = 1;
    const bool is_dict = pmt::is_dict(meta);
    if (is_dict &&
        !(meta_uint(meta, "type", 255, type) && meta_uint(meta, "src", 0xFFFF, src) &&
          meta_uint(meta, "dst", 0xFFFF, dst) && meta_uint(meta, "msg_id", 0xFFFFFFFFu, msg_id) &&
          meta_uint(meta, "seq", 0xFFFFFFFFu, seq) &&
          meta_uint(meta, "count", 0xFFFFFFFFu, count))) {
        error = "dropping a PDU with a malformed header field in its metadata";
        return false;
    }
    h.type = uint8_t(type);
    h.src = uint16_t(src);
    h.dst = uint16_t(dst);
    h.msg_id = uint32_t(msg_id);
    h.seq = uint32_t(seq);
    h.count = uint32_t(count);
    try {
        out = frame::build(h, data, len, mtu);
    } catch (const std::invalid_argument& e) {
        error = std::string("dropping PDU: ") + e.what();
        return false;
    }
    if (!is_dict || pmt::is_null(pmt::dict_ref(meta, pmt::mp("msg_id"), pmt::PMT_NIL)))
        next_msg_id++;
    return true;
}

} // namespace detail
} // namespace scaleflu
} // namespace gr
