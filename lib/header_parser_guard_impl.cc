/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#include "header_parser_guard_impl.h"
#include <gnuradio/io_signature.h>
#include <stdexcept>

namespace gr {
namespace scaleflu {

header_parser_guard::sptr
header_parser_guard::make(const std::vector<std::vector<int>>& occupied_carriers,
                          int n_syms,
                          const std::string& len_tag_key,
                          const std::string& frame_len_tag_key,
                          const std::string& num_tag_key,
                          int bits_per_header_sym,
                          int bits_per_payload_sym,
                          bool scramble_header,
                          int max_packet_len)
{
    return gnuradio::make_block_sptr<header_parser_guard_impl>(occupied_carriers,
                                                               n_syms,
                                                               len_tag_key,
                                                               frame_len_tag_key,
                                                               num_tag_key,
                                                               bits_per_header_sym,
                                                               bits_per_payload_sym,
                                                               scramble_header,
                                                               max_packet_len);
}

header_parser_guard_impl::header_parser_guard_impl(
    const std::vector<std::vector<int>>& occupied_carriers,
    int n_syms,
    const std::string& len_tag_key,
    const std::string& frame_len_tag_key,
    const std::string& num_tag_key,
    int bits_per_header_sym,
    int bits_per_payload_sym,
    bool scramble_header,
    int max_packet_len)
    : gr::sync_block("header_parser_guard",
                     gr::io_signature::make(1, 1, sizeof(unsigned char)),
                     gr::io_signature::make(0, 0, 0)),
      d_max(max_packet_len),
      d_len_key(pmt::mp(len_tag_key)),
      d_port(pmt::mp("header_data"))
{
    if (max_packet_len < 1)
        throw std::invalid_argument("header_parser_guard: max_packet_len must be >= 1");
    if (occupied_carriers.empty() || n_syms < 1 || bits_per_header_sym < 1 ||
        bits_per_payload_sym < 1)
        throw std::invalid_argument("header_parser_guard: bad OFDM header parameters");
    d_formatter = gr::digital::packet_header_ofdm::make(occupied_carriers,
                                                       n_syms,
                                                       len_tag_key,
                                                       frame_len_tag_key,
                                                       num_tag_key,
                                                       bits_per_header_sym,
                                                       bits_per_payload_sym,
                                                       scramble_header);
    message_port_register_out(d_port);
    set_output_multiple(int(d_formatter->header_len()));
}

void header_parser_guard_impl::publish(const pmt::pmt_t& verdict)
{
    if (d_demux)
        d_demux->header_data(verdict);
    else
        message_port_pub(d_port, verdict);
}

int header_parser_guard_impl::work(int noutput_items,
                                   gr_vector_const_void_star& input_items,
                                   gr_vector_void_star&)
{
    // as digital::packet_headerparser_b: one header per call
    const long hlen = d_formatter->header_len();
    if (noutput_items < hlen)
        return 0;
    const auto* in = static_cast<const unsigned char*>(input_items[0]);
    std::vector<tag_t> tags;
    get_tags_in_range(tags, 0, nitems_read(0), nitems_read(0) + hlen);
    if (!d_formatter->header_parser(in, tags)) {
        d_invalid++;
        publish(pmt::PMT_F);
        return int(hlen);
    }
    pmt::pmt_t dict = pmt::make_dict();
    for (const tag_t& t : tags)
        dict = pmt::dict_add(dict, t.key, t.value);
    const pmt::pmt_t n = pmt::dict_ref(dict, d_len_key, pmt::PMT_NIL);
    if (!pmt::is_integer(n) || pmt::to_long(n) < 0 || pmt::to_long(n) > d_max) {
        d_rejected++;
        publish(pmt::PMT_F);
        return int(hlen);
    }
    d_passed++;
    publish(dict);
    return int(hlen);
}

} /* namespace scaleflu */
} /* namespace gr */
