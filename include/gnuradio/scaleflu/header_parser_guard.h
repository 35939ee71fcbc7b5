/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_HEADER_PARSER_GUARD_H
#define INCLUDED_SCALEFLU_HEADER_PARSER_GUARD_H

#include <gnuradio/scaleflu/api.h>
#include <gnuradio/scaleflu/ofdm_burst_demux.h>
#include <gnuradio/sync_block.h>
#include <cstdint>
#include <string>
#include <vector>

namespace gr {
namespace scaleflu {

/*!
 * \brief digital.packet_headerparser_b with a packet_header_ofdm formatter and the header
 * guard in one block.
 * \ingroup scaleflu
 *
 * \details
 * Consumes the demodulated OFDM header bits (header_len items per header) and posts on
 * "header_data" what packet_headerparser_b posts (a dict of the header's tags, or #f for a
 * header that fails its CRC), except that a header announcing more than \p max_packet_len
 * (the length tag, in payload symbols) is also posted as #f and counted in rejected(): a
 * noisy header that passes the 8-bit CRC would otherwise make the header/payload demux wait
 * for more samples than its buffer holds. One block instead of packet_headerparser_b ->
 * header_guard saves the demux a message hop (a thread wake-up) per frame while it waits
 * for the header: measured about 10 % of the OFDM receive chain's CPU time.
 */
class SCALEFLU_API header_parser_guard : virtual public gr::sync_block
{
public:
    typedef std::shared_ptr<header_parser_guard> sptr;

    /*! Arguments as digital.packet_header_ofdm's, plus \p max_packet_len (>= 1). */
    static sptr make(const std::vector<std::vector<int>>& occupied_carriers,
                     int n_syms,
                     const std::string& len_tag_key,
                     const std::string& frame_len_tag_key,
                     const std::string& num_tag_key,
                     int bits_per_header_sym,
                     int bits_per_payload_sym,
                     bool scramble_header,
                     int max_packet_len);

    virtual uint64_t rejected() const = 0; //!< headers announcing more than max_packet_len
    virtual uint64_t passed() const = 0;   //!< headers passed on
    virtual uint64_t invalid() const = 0;  //!< headers that failed their CRC
    virtual int header_len() const = 0;    //!< header bits consumed per header
    /*!
     * Hand each verdict straight to \p demux (ofdm_burst_demux::header_data, called from this
     * block's thread) instead of posting it on "header_data"; nullptr: post it again.
     */
    virtual void set_demux(ofdm_burst_demux::sptr demux) = 0;
};

} // namespace scaleflu
} // namespace gr

#endif /* INCLUDED_SCALEFLU_HEADER_PARSER_GUARD_H */
