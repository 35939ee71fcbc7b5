/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_CODED_SIGNAL_DECODER_IMPL_H
#define INCLUDED_SCALEFLU_CODED_SIGNAL_DECODER_IMPL_H

#include <gnuradio/scaleflu/coded_phy.h>
#include <gnuradio/scaleflu/coded_signal_decoder.h>
#include <atomic>

namespace gr {
namespace scaleflu {

class coded_signal_decoder_impl : public coded_signal_decoder
{
private:
    const size_t d_max_len;
    const pmt::pmt_t d_len_key;
    const pmt::pmt_t d_port;
    const pmt::pmt_t d_report;
    phy::viterbi_decoder d_vd;
    phy::channel_smoother d_smoother;
    ofdm_burst_demux::sptr d_demux;
    std::atomic<uint64_t> d_headers{ 0 }, d_passed{ 0 }, d_crc{ 0 }, d_version{ 0 },
        d_unknown{ 0 }, d_length{ 0 }, d_no_channel{ 0 };

    void publish(const pmt::pmt_t& verdict);
    void reject(const char* reason);
    void decode(const gr_complex* y0, const gr_complex* y1, const std::vector<tag_t>& tags);

    std::atomic<int> d_node{ -1 };

public:
    coded_signal_decoder_impl(int max_psdu_len, const std::string& frame_len_key);

    int work(int noutput_items,
             gr_vector_const_void_star& input_items,
             gr_vector_void_star& output_items) override;

    void set_demux(ofdm_burst_demux::sptr demux) override { d_demux = demux; }
    void set_node_id(int node_id) override { d_node = node_id; }
    uint64_t headers() const override { return d_headers; }
    uint64_t passed() const override { return d_passed; }
    uint64_t crc_failed() const override { return d_crc; }
    uint64_t version_mismatch() const override { return d_version; }
    uint64_t unknown_mcs() const override { return d_unknown; }
    uint64_t bad_length() const override { return d_length; }
    uint64_t no_channel() const override { return d_no_channel; }
};

} // namespace scaleflu
} // namespace gr

#endif
