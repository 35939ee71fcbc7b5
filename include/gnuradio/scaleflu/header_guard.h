/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_HEADER_GUARD_H
#define INCLUDED_SCALEFLU_HEADER_GUARD_H

#include <gnuradio/block.h>
#include <gnuradio/scaleflu/api.h>
#include <cstdint>
#include <string>

namespace gr {
namespace scaleflu {

/*!
 * \brief Passes OFDM header_data messages; headers announcing oversized packets become PMT_F.
 * \ingroup scaleflu
 *
 * \details
 * Sits between digital.packet_headerparser_b ("header_data") and
 * digital.header_payload_demux ("header_data"). A noisy header whose 8-bit CRC passes by
 * chance can announce up to 4095 bytes; the demux then waits for more samples than its
 * buffer holds and the receiver stalls for good. Frames longer than the link MTU are never
 * sent, so a header whose \p len_tag_key entry exceeds \p max_packet_len (in the header's
 * own unit: payload symbols for packet_header_ofdm) or is missing is replaced by PMT_F
 * (the demux resumes searching) and counted.
 */
class SCALEFLU_API header_guard : virtual public gr::block
{
public:
    typedef std::shared_ptr<header_guard> sptr;

    static sptr make(int max_packet_len, const std::string& len_tag_key = "packet_len");

    virtual uint64_t rejected() const = 0;
    virtual uint64_t passed() const = 0;
};

} // namespace scaleflu
} // namespace gr

#endif /* INCLUDED_SCALEFLU_HEADER_GUARD_H */
