/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#include "ofdm_burst_demux_impl.h"
#include <gnuradio/io_signature.h>
#include <chrono>
#include <cstring>
#include <stdexcept>

namespace gr {
namespace scaleflu {

namespace {
const pmt::pmt_t PORT_HEADER_DATA = pmt::mp("header_data");
// longest sleep of the block's thread waiting for a verdict (then the scheduler's loop runs
// once: stop requests, messages on the "header_data" port)
constexpr auto MAX_WAIT = std::chrono::milliseconds(10);
} // namespace

ofdm_burst_demux::sptr ofdm_burst_demux::make(int header_len,
                                              int fft_len,
                                              int cp_len,
                                              const std::string& frame_len_key,
                                              int max_payload_symbols)
{
    return gnuradio::make_block_sptr<ofdm_burst_demux_impl>(
        header_len, fft_len, cp_len, frame_len_key, max_payload_symbols);
}

ofdm_burst_demux_impl::ofdm_burst_demux_impl(int header_len,
                                             int fft_len,
                                             int cp_len,
                                             const std::string& frame_len_key,
                                             int max_payload_symbols)
    : gr::block("ofdm_burst_demux",
                gr::io_signature::make2(2, 2, sizeof(gr_complex), sizeof(char)),
                gr::io_signature::make(2, 2, sizeof(gr_complex) * std::max(fft_len, 1))),
      d_header_len(header_len),
      d_fft(fft_len),
      d_cp(cp_len),
      d_sym(fft_len + cp_len),
      d_len_key(pmt::mp(frame_len_key)),
      d_max_payload(max_payload_symbols)
{
    if (header_len < 1 || fft_len < 1 || cp_len < 0 || max_payload_symbols < 1)
        throw std::invalid_argument("ofdm_burst_demux: header_len, fft_len and "
                                    "max_payload_symbols must be >= 1, cp_len >= 0");
    set_tag_propagation_policy(TPP_DONT);
    set_relative_rate(1, uint64_t(d_sym));
    set_min_noutput_items(d_header_len);
    // room for the longest payload (work is only called with that much room for it)
    set_min_output_buffer(0, 2 * d_header_len);
    set_min_output_buffer(1, 2 * d_max_payload);
    message_port_register_in(PORT_HEADER_DATA);
    set_msg_handler(PORT_HEADER_DATA, [this](const pmt::pmt_t& msg) { header_data(msg); });
}

void ofdm_burst_demux_impl::header_data(pmt::pmt_t msg)
{
    {
        std::lock_guard<std::mutex> lk(d_mutex);
        d_verdicts.push_back(msg);
    }
    d_cond.notify_one();
}

bool ofdm_burst_demux_impl::stop()
{
    // a work call waiting for a verdict returns within MAX_WAIT; wake it now
    d_cond.notify_all();
    return true;
}

void ofdm_burst_demux_impl::set_state(state s)
{
    d_state = s;
    // the executor calls work only with room for what the state puts out (else it waits
    // for the consumers instead of calling work again and again)
    set_min_noutput_items(s == state::PAYLOAD ? d_payload_len : d_header_len);
}

void ofdm_burst_demux_impl::forecast(int, gr_vector_int& ninput_items_required)
{
    int n = 1;
    if (d_state == state::HEADER)
        n = d_header_len * d_sym;
    else if (d_state == state::PAYLOAD)
        n = d_payload_len * d_sym;
    for (auto& r : ninput_items_required)
        r = n;
}

void ofdm_burst_demux_impl::copy_symbols(const gr_complex* in, gr_complex* out, int n) const
{
    for (int i = 0; i < n; i++) // drop each symbol's cyclic prefix
        std::memcpy(out + size_t(i) * d_fft,
                    in + size_t(i) * d_sym + d_cp,
                    size_t(d_fft) * sizeof(gr_complex));
}

bool ofdm_burst_demux_impl::take_verdict(bool wait)
{
    pmt::pmt_t msg;
    {
        std::unique_lock<std::mutex> lk(d_mutex);
        if (d_verdicts.empty() && wait)
            d_cond.wait_for(lk, MAX_WAIT, [this] { return !d_verdicts.empty(); });
        if (d_verdicts.empty())
            return false;
        msg = d_verdicts.front();
        d_verdicts.pop_front();
    }
    long len = -1;
    d_payload_tags.clear();
    if (pmt::is_integer(msg)) {
        len = pmt::to_long(msg);
        d_payload_tags.emplace_back(d_len_key, msg);
    } else if (pmt::is_dict(msg)) {
        for (pmt::pmt_t items = pmt::dict_items(msg); !pmt::is_null(items);
             items = pmt::cdr(items)) {
            const pmt::pmt_t kv = pmt::car(items);
            d_payload_tags.emplace_back(pmt::car(kv), pmt::cdr(kv));
            if (pmt::eqv(pmt::car(kv), d_len_key) && pmt::is_integer(pmt::cdr(kv)))
                len = pmt::to_long(pmt::cdr(kv));
        }
    }
    if (len < 1 || len > d_max_payload) { // #f, no or a bad length: search on, one sample on
        d_payload_tags.clear();
        d_failed++;
        return true;
    }
    d_payload_len = int(len);
    return true;
}

int ofdm_burst_demux_impl::general_work(int noutput_items,
                                        gr_vector_int& ninput_items,
                                        gr_vector_const_void_star& input_items,
                                        gr_vector_void_star& output_items)
{
    const auto* in = static_cast<const gr_complex*>(input_items[0]);
    const auto* trig = static_cast<const unsigned char*>(input_items[1]);
    auto* out_hdr = static_cast<gr_complex*>(output_items[0]);
    auto* out_pay = static_cast<gr_complex*>(output_items[1]);
    const int n_in = std::min(ninput_items[0], ninput_items[1]);
    int used = 0, n_hdr = 0, n_pay = 0;
    bool more = true;
    while (more) {
        switch (d_state) {
        case state::FIND: {
            int i = used;
            while (i < n_in && !trig[i])
                i++;
            used = i;
            if (i < n_in)
                set_state(state::HEADER);
            else
                more = false;
            break;
        }
        case state::HEADER:
            if (n_in - used < d_header_len * d_sym || noutput_items - n_hdr < d_header_len) {
                more = false;
                break;
            }
            copy_symbols(in + used, out_hdr + size_t(n_hdr) * d_fft, d_header_len);
            n_hdr += d_header_len;
            d_headers++;
            set_state(state::WAIT);
            more = false; // hand the header on before waiting for its verdict
            break;
        case state::WAIT: {
            const bool idle = used == 0 && n_hdr == 0 && n_pay == 0;
            const long before = d_failed;
            if (!take_verdict(idle)) {
                more = false;
                break;
            }
            if (long(d_failed) != before) {
                used += 1; // as the stock demux: the next trigger search starts one on
                set_state(state::FIND);
            } else {
                used += d_header_len * d_sym; // the header's samples
                set_state(state::PAYLOAD);
            }
            break;
        }
        case state::PAYLOAD: {
            const int need = d_payload_len * d_sym;
            if (n_in - used < need || noutput_items - n_pay < d_payload_len) {
                more = false;
                break;
            }
            copy_symbols(in + used, out_pay + size_t(n_pay) * d_fft, d_payload_len);
            const uint64_t at = nitems_written(1) + uint64_t(n_pay);
            for (const auto& kv : d_payload_tags)
                add_item_tag(1, at, kv.first, kv.second);
            n_pay += d_payload_len;
            d_payloads++;
            used += need - 1; // as the stock demux: the last sample stays for the search
            set_state(state::FIND);
            break;
        }
        }
    }
    consume_each(used);
    produce(0, n_hdr);
    produce(1, n_pay);
    return WORK_CALLED_PRODUCE;
}

} /* namespace scaleflu */
} /* namespace gr */
