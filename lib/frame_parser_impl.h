/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_FRAME_PARSER_IMPL_H
#define INCLUDED_SCALEFLU_FRAME_PARSER_IMPL_H

#include <gnuradio/scaleflu/frame_parser.h>
#include <atomic>

namespace gr {
namespace scaleflu {

class frame_parser_impl : public frame_parser
{
private:
    const int d_node_id;
    const size_t d_mtu;
    std::atomic<uint64_t> d_ok{ 0 };
    std::atomic<uint64_t> d_crc{ 0 };
    std::atomic<uint64_t> d_malformed{ 0 };
    std::atomic<uint64_t> d_filtered{ 0 };
    std::atomic<bool> d_raw{ false };

    void handle(const pmt::pmt_t& msg);

public:
    frame_parser_impl(int node_id, int mtu);

    uint64_t frames_ok() const override { return d_ok; }
    uint64_t crc_errors() const override { return d_crc; }
    uint64_t malformed() const override { return d_malformed; }
    uint64_t filtered() const override { return d_filtered; }
    void set_raw_output(bool raw) override { d_raw = raw; }
    bool raw_output() const override { return d_raw; }
};

} // namespace scaleflu
} // namespace gr

#endif
