/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_OFDM_PREAMBLE_SYNC_IMPL_H
#define INCLUDED_SCALEFLU_OFDM_PREAMBLE_SYNC_IMPL_H

#include <gnuradio/scaleflu/ofdm_preamble_sync.h>
#include <atomic>
#include <complex>
#include <deque>
#include <vector>

namespace gr {
namespace scaleflu {

class ofdm_preamble_sync_impl : public ofdm_preamble_sync
{
private:
    struct candidate {
        uint64_t first;  // first metric sample above the threshold
        uint64_t best_d; // where the metric peaked
        double best_m;
    };
    const int d_fft, d_cp, d_half, d_sym;
    const float d_threshold, d_min_xcorr;
    const int d_backoff;
    const int d_delay;
    const int d_hist;
    std::vector<gr_complex> d_s2; // time-domain body of the second sync symbol
    double d_s2_energy;
    double d_sign = 1.0; // -1: sync symbol 1 on odd subcarriers
    // running Schmidl & Cox sums for the window starting at d_next_d - 1
    std::complex<double> d_p{ 0, 0 };
    double d_r = 0;
    bool d_primed = false;
    uint64_t d_since_recompute = 0;
    std::deque<candidate> d_cands;
    uint64_t d_holdoff = 0;
    std::deque<std::pair<uint64_t, float>> d_events; // (output index, frequency)
    float d_freq = 0;
    std::atomic<uint64_t> d_detections{ 0 }, d_rejected{ 0 };

    void recompute(const gr_complex* in, uint64_t base, uint64_t d);
    bool locate(const gr_complex* in, uint64_t base, uint64_t peak_d);

public:
    ofdm_preamble_sync_impl(int fft_len,
                            int cp_len,
                            const std::vector<gr_complex>& sync_word1,
                            const std::vector<gr_complex>& sync_word2,
                            float threshold,
                            float min_xcorr,
                            int backoff);

    int work(int noutput_items,
             gr_vector_const_void_star& input_items,
             gr_vector_void_star& output_items) override;

    int delay() const override { return d_delay; }
    uint64_t detections() const override { return d_detections; }
    uint64_t rejected() const override { return d_rejected; }
};

} // namespace scaleflu
} // namespace gr

#endif
