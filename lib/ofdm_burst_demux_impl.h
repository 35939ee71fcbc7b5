/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_OFDM_BURST_DEMUX_IMPL_H
#define INCLUDED_SCALEFLU_OFDM_BURST_DEMUX_IMPL_H

#include <gnuradio/scaleflu/ofdm_burst_demux.h>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <vector>

namespace gr {
namespace scaleflu {

class ofdm_burst_demux_impl : public ofdm_burst_demux
{
private:
    enum class state { FIND, HEADER, WAIT, PAYLOAD };
    const int d_header_len;
    const int d_fft;
    const int d_cp;
    const int d_sym; // fft + cp
    const pmt::pmt_t d_len_key;
    const int d_max_payload;
    state d_state = state::FIND;
    int d_payload_len = 0;
    std::vector<std::pair<pmt::pmt_t, pmt::pmt_t>> d_payload_tags;
    std::mutex d_mutex;
    std::condition_variable d_cond;
    std::deque<pmt::pmt_t> d_verdicts; // header_data not yet taken (at most one expected)
    std::atomic<uint64_t> d_headers{ 0 };
    std::atomic<uint64_t> d_payloads{ 0 };
    std::atomic<uint64_t> d_failed{ 0 };

    void copy_symbols(const gr_complex* in, gr_complex* out, int n) const;
    bool take_verdict(bool wait);
    void set_state(state s);

public:
    ofdm_burst_demux_impl(int header_len,
                          int fft_len,
                          int cp_len,
                          const std::string& frame_len_key,
                          int max_payload_symbols);

    void forecast(int noutput_items, gr_vector_int& ninput_items_required) override;
    int general_work(int noutput_items,
                     gr_vector_int& ninput_items,
                     gr_vector_const_void_star& input_items,
                     gr_vector_void_star& output_items) override;
    bool stop() override;

    void header_data(pmt::pmt_t msg) override;
    uint64_t headers() const override { return d_headers; }
    uint64_t payloads() const override { return d_payloads; }
    uint64_t failed() const override { return d_failed; }
};

} // namespace scaleflu
} // namespace gr

#endif
