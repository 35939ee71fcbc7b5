/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_CODED_OFDM_DEMOD_IMPL_H
#define INCLUDED_SCALEFLU_CODED_OFDM_DEMOD_IMPL_H

#include <gnuradio/scaleflu/coded_ofdm_demod.h>
#include <gnuradio/scaleflu/coded_phy.h>
#include <atomic>
#include <vector>

namespace gr {
namespace scaleflu {

class coded_ofdm_demod_impl : public coded_ofdm_demod
{
private:
    const size_t d_max_len;
    const pmt::pmt_t d_len_key;
    const int d_symbols_out;
    const int d_max_sym;
    phy::viterbi_decoder d_vd;
    // the frame being collected
    bool d_active = false;
    int d_n_sym = 0;
    int d_mcs = 0;
    int d_len = 0;
    int d_offset = 0;
    double d_noise = 1.0;
    double d_snr_db = 0.0;
    std::vector<gr_complex> d_h;
    std::vector<gr_complex> d_syms; // collected FFT vectors
    std::atomic<uint64_t> d_ok{ 0 }, d_crc{ 0 }, d_bad{ 0 };
    std::vector<std::atomic<uint64_t>> d_ok_per_mcs;
    std::atomic<double> d_last_snr{ 0.0 };

    bool start_frame(const std::vector<tag_t>& tags);
    void finish_frame();

    std::atomic<int> d_node{ -1 };

public:
    coded_ofdm_demod_impl(int max_psdu_len, const std::string& frame_len_key, int symbols_out);

    int work(int noutput_items,
             gr_vector_const_void_star& input_items,
             gr_vector_void_star& output_items) override;

    void set_node_id(int node_id) override { d_node = node_id; }
    uint64_t frames_ok() const override { return d_ok; }
    uint64_t crc_errors() const override { return d_crc; }
    uint64_t bad_frames() const override { return d_bad; }
    std::vector<uint64_t> frames_ok_per_mcs() const override;
    double last_snr_db() const override { return d_last_snr; }
};

} // namespace scaleflu
} // namespace gr

#endif
