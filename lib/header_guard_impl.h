/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_HEADER_GUARD_IMPL_H
#define INCLUDED_SCALEFLU_HEADER_GUARD_IMPL_H

#include <gnuradio/scaleflu/header_guard.h>
#include <atomic>

namespace gr {
namespace scaleflu {

class header_guard_impl : public header_guard
{
private:
    const long d_max;
    const pmt::pmt_t d_key;
    std::atomic<uint64_t> d_rejected{ 0 };
    std::atomic<uint64_t> d_passed{ 0 };

    void handle(const pmt::pmt_t& msg);

public:
    header_guard_impl(int max_packet_len, const std::string& len_tag_key);

    uint64_t rejected() const override { return d_rejected; }
    uint64_t passed() const override { return d_passed; }
};

} // namespace scaleflu
} // namespace gr

#endif
