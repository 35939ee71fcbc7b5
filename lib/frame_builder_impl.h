/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_FRAME_BUILDER_IMPL_H
#define INCLUDED_SCALEFLU_FRAME_BUILDER_IMPL_H

#include <gnuradio/scaleflu/frame_builder.h>
#include <gnuradio/scaleflu/frame_format.h>
#include <atomic>
#include <vector>

namespace gr {
namespace scaleflu {

class frame_builder_impl : public frame_builder
{
private:
    const size_t d_mtu;
    const uint16_t d_src;
    const uint16_t d_dst;
    uint32_t d_next_msg_id = 0;
    std::vector<uint8_t> d_frame; // frame waiting for output space
    std::atomic<uint64_t> d_built{ 0 };
    std::atomic<uint64_t> d_dropped{ 0 };

    bool take_next_pdu();

protected:
    int calculate_output_stream_length(const gr_vector_int& ninput_items) override;

public:
    frame_builder_impl(int mtu, int src, int dst, const std::string& len_tag_key);

    int work(int noutput_items,
             gr_vector_int& ninput_items,
             gr_vector_const_void_star& input_items,
             gr_vector_void_star& output_items) override;

    uint64_t frames_built() const override { return d_built; }
    uint64_t frames_dropped() const override { return d_dropped; }
    int mtu() const override { return int(d_mtu); }
};

} // namespace scaleflu
} // namespace gr

#endif
