/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_PDU_FRAME_H
#define INCLUDED_SCALEFLU_PDU_FRAME_H

#include <gnuradio/scaleflu/frame_format.h>
#include <pmt/pmt.h>
#include <cstdint>
#include <string>
#include <vector>

namespace gr {
namespace scaleflu {
namespace detail {

/*!
 * One PDU to one link frame, as the Frame Builder does it: a PDU with metadata "raw" = #t
 * holds a whole frame, checked as a receiver would (mtu, magic, version, length, CRC32,
 * type, sequence) and copied; otherwise the u8vector is the payload and the header fields
 * come from the metadata ("type", "src", "dst", "msg_id", "seq", "count"; defaults DATA,
 * \p src, \p dst, \p next_msg_id (then incremented), 0, 1). False with \p error set when
 * the PDU must be dropped.
 */
bool pdu_to_frame(const pmt::pmt_t& msg,
                  size_t mtu,
                  uint16_t src,
                  uint16_t dst,
                  uint32_t& next_msg_id,
                  std::vector<uint8_t>& out,
                  std::string& error);

} // namespace detail
} // namespace scaleflu
} // namespace gr

#endif
