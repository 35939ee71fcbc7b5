/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_HEADER_PARSER_GUARD_IMPL_H
#define INCLUDED_SCALEFLU_HEADER_PARSER_GUARD_IMPL_H

#include <gnuradio/digital/packet_header_ofdm.h>
#include <gnuradio/scaleflu/header_parser_guard.h>
#include <atomic>

namespace gr {
namespace scaleflu {

class header_parser_guard_impl : public header_parser_guard
{
private:
    gr::digital::packet_header_ofdm::sptr d_formatter;
    const long d_max;
    const pmt::pmt_t d_len_key;
    const pmt::pmt_t d_port;
    std::atomic<uint64_t> d_rejected{ 0 };
    std::atomic<uint64_t> d_passed{ 0 };
    std::atomic<uint64_t> d_invalid{ 0 };
    ofdm_burst_demux::sptr d_demux;
    void publish(const pmt::pmt_t& verdict);

public:
    header_parser_guard_impl(const std::vector<std::vector<int>>& occupied_carriers,
                             int n_syms,
                             const std::string& len_tag_key,
                             const std::string& frame_len_tag_key,
                             const std::string& num_tag_key,
                             int bits_per_header_sym,
                             int bits_per_payload_sym,
                             bool scramble_header,
                             int max_packet_len);

    int work(int noutput_items,
             gr_vector_const_void_star& input_items,
             gr_vector_void_star& output_items) override;

    uint64_t rejected() const override { return d_rejected; }
    uint64_t passed() const override { return d_passed; }
    uint64_t invalid() const override { return d_invalid; }
    int header_len() const override { return int(d_formatter->header_len()); }
    void set_demux(ofdm_burst_demux::sptr demux) override { d_demux = demux; }
};

} // namespace scaleflu
} // namespace gr

#endif
