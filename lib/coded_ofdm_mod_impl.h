/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_CODED_OFDM_MOD_IMPL_H
#define INCLUDED_SCALEFLU_CODED_OFDM_MOD_IMPL_H

#include <gnuradio/fft/fft.h>
#include <gnuradio/scaleflu/coded_ofdm_mod.h>
#include <gnuradio/scaleflu/coded_phy.h>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace gr {
namespace scaleflu {

class coded_ofdm_mod_impl : public coded_ofdm_mod
{
private:
    std::vector<gr_complex> d_sw1, d_sw2; // shifted order
    const int d_cp;
    const size_t d_mtu;
    const int d_post;
    const bool d_framing;
    const uint16_t d_src, d_dst;
    uint32_t d_next_msg_id = 0;
    std::atomic<int> d_mcs;
    mutable std::mutex d_dst_mutex;
    std::unordered_map<int, int> d_dst_mcs; // destination -> MCS index
    std::atomic<float> d_amplitude{ 1.0f };
    std::vector<gr_complex> d_burst; // burst waiting for output space
    gr::fft::fft_complex_rev d_ifft;
    std::atomic<uint64_t> d_built{ 0 };
    std::atomic<uint64_t> d_dropped{ 0 };
    std::vector<std::atomic<uint64_t>> d_per_mcs;
    int d_max_burst;

    bool take_next_pdu();
    void add_symbol(const gr_complex* shifted, float scale); // IFFT, prefix, append
    void build_burst(const phy::mcs_info& m, const std::vector<uint8_t>& psdu);

protected:
    int calculate_output_stream_length(const gr_vector_int& ninput_items) override;

public:
    coded_ofdm_mod_impl(const std::vector<gr_complex>& sync_word1,
                        const std::vector<gr_complex>& sync_word2,
                        int cp_len,
                        int mcs,
                        int mtu,
                        int post_padding,
                        bool framing,
                        int src,
                        int dst,
                        const std::string& len_tag_key);

    int work(int noutput_items,
             gr_vector_int& ninput_items,
             gr_vector_const_void_star& input_items,
             gr_vector_void_star& output_items) override;

    void set_mcs(int mcs) override;
    int mcs() const override { return d_mcs; }
    void set_dst_mcs(int dst, int mcs) override;
    int dst_mcs(int dst) const override;
    void set_amplitude(float a) override { d_amplitude = a; }
    float amplitude() const override { return d_amplitude; }
    uint64_t frames_built() const override { return d_built; }
    uint64_t frames_dropped() const override { return d_dropped; }
    std::vector<uint64_t> frames_per_mcs() const override;
    int max_burst_len() const override { return d_max_burst; }
};

} // namespace scaleflu
} // namespace gr

#endif
