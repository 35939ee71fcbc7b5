/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#include "coded_ofdm_mod_impl.h"
#include "pdu_frame.h"
#include <gnuradio/io_signature.h>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace gr {
namespace scaleflu {

namespace {
const pmt::pmt_t PORT_IN = pmt::mp("in");
const pmt::pmt_t KEY_MCS = pmt::mp("mcs");

// An MCS given as an index (integer) or a name (symbol or string); nullptr when unknown.
const phy::mcs_info* mcs_from_pmt(const pmt::pmt_t& v)
{
    if (pmt::is_integer(v))
        return phy::mcs_by_index(int(pmt::to_long(v)));
    if (pmt::is_uint64(v))
        return pmt::to_uint64(v) < 64 ? phy::mcs_by_index(int(pmt::to_uint64(v))) : nullptr;
    if (pmt::is_symbol(v))
        return phy::mcs_by_name(pmt::symbol_to_string(v));
    return nullptr;
}
} // namespace

coded_ofdm_mod::sptr coded_ofdm_mod::make(const std::vector<gr_complex>& sync_word1,
                                          const std::vector<gr_complex>& sync_word2,
                                          int cp_len,
                                          int mcs,
                                          int mtu,
                                          int post_padding,
                                          bool framing,
                                          int src,
                                          int dst,
                                          const std::string& len_tag_key)
{
    return gnuradio::make_block_sptr<coded_ofdm_mod_impl>(sync_word1,
                                                          sync_word2,
                                                          cp_len,
                                                          mcs,
                                                          mtu,
                                                          post_padding,
                                                          framing,
                                                          src,
                                                          dst,
                                                          len_tag_key);
}

coded_ofdm_mod_impl::coded_ofdm_mod_impl(const std::vector<gr_complex>& sync_word1,
                                         const std::vector<gr_complex>& sync_word2,
                                         int cp_len,
                                         int mcs,
                                         int mtu,
                                         int post_padding,
                                         bool framing,
                                         int src,
                                         int dst,
                                         const std::string& len_tag_key)
    : gr::tagged_stream_block("coded_ofdm_mod",
                              gr::io_signature::make(0, 0, 0),
                              gr::io_signature::make(1, 1, sizeof(gr_complex)),
                              len_tag_key),
      d_sw1(sync_word1),
      d_sw2(sync_word2),
      d_cp(cp_len),
      d_mtu(size_t(mtu)),
      d_post(post_padding),
      d_framing(framing),
      d_src(uint16_t(src)),
      d_dst(uint16_t(dst)),
      d_mcs(mcs),
      d_ifft(phy::FFT_LEN),
      d_per_mcs(size_t(phy::mcs_count()))
{
    if (sync_word1.size() != size_t(phy::FFT_LEN) || sync_word2.size() != size_t(phy::FFT_LEN))
        throw std::invalid_argument("coded_ofdm_mod: the sync words must have 64 values");
    if (cp_len < 0 || cp_len > phy::FFT_LEN)
        throw std::invalid_argument("coded_ofdm_mod: cp_len must be in [0, 64]");
    if (post_padding < 0)
        throw std::invalid_argument("coded_ofdm_mod: post_padding must be >= 0");
    const int min_mtu = framing ? int(frame::OVERHEAD + 1) : 1;
    if (mtu < min_mtu || size_t(mtu) > phy::MAX_PSDU_LEN)
        throw std::invalid_argument("coded_ofdm_mod: mtu must be in [" +
                                    std::to_string(min_mtu) + ", 65535], got " +
                                    std::to_string(mtu));
    if (src < 0 || src > 0xFFFF || dst < 0 || dst > 0xFFFF)
        throw std::invalid_argument("coded_ofdm_mod: src and dst must be in [0, 65535]");
    if (!phy::mcs_by_index(mcs))
        throw std::invalid_argument("coded_ofdm_mod: unknown mcs " + std::to_string(mcs));
    for (auto& c : d_per_mcs)
        c = 0;
    int longest = 0;
    for (int i = 0; i < phy::mcs_count(); i++)
        longest = std::max(longest, phy::payload_symbols(*phy::mcs_by_index(i), d_mtu));
    d_max_burst = (4 + longest) * (phy::FFT_LEN + d_cp) + d_post;
    message_port_register_in(PORT_IN);
    set_min_output_buffer(0, 2 * d_max_burst); // one whole burst must fit
}

void coded_ofdm_mod_impl::set_mcs(int mcs)
{
    if (!phy::mcs_by_index(mcs))
        throw std::invalid_argument("coded_ofdm_mod: unknown mcs " + std::to_string(mcs));
    d_mcs = mcs;
}

void coded_ofdm_mod_impl::set_dst_mcs(int dst, int mcs)
{
    if (mcs >= 0 && !phy::mcs_by_index(mcs))
        throw std::invalid_argument("coded_ofdm_mod: unknown mcs " + std::to_string(mcs));
    std::lock_guard<std::mutex> lk(d_dst_mutex);
    if (mcs < 0)
        d_dst_mcs.erase(dst);
    else
        d_dst_mcs[dst] = mcs;
}

int coded_ofdm_mod_impl::dst_mcs(int dst) const
{
    std::lock_guard<std::mutex> lk(d_dst_mutex);
    const auto it = d_dst_mcs.find(dst);
    return it == d_dst_mcs.end() ? int(d_mcs) : it->second;
}

std::vector<uint64_t> coded_ofdm_mod_impl::frames_per_mcs() const
{
    std::vector<uint64_t> out;
    for (const auto& c : d_per_mcs)
        out.push_back(c);
    return out;
}

void coded_ofdm_mod_impl::add_symbol(const gr_complex* shifted, float scale)
{
    const int n = phy::FFT_LEN;
    gr_complex* in = d_ifft.get_inbuf();
    for (int j = 0; j < n; j++) // shifted index j is subcarrier j - 32, natural (j + 32) % 64
        in[(j + n / 2) % n] = shifted[j] * scale;
    d_ifft.execute();
    const gr_complex* out = d_ifft.get_outbuf();
    d_burst.insert(d_burst.end(), out + n - d_cp, out + n);
    d_burst.insert(d_burst.end(), out, out + n);
}

void coded_ofdm_mod_impl::build_burst(const phy::mcs_info& m, const std::vector<uint8_t>& psdu)
{
    const int n_sym = phy::payload_symbols(m, psdu.size());
    const float scale = d_amplitude / std::sqrt(float(phy::N_OCCUPIED));
    d_burst.clear();
    d_burst.reserve(size_t(4 + n_sym) * size_t(phy::FFT_LEN + d_cp) + size_t(d_post));
    add_symbol(d_sw1.data(), scale);
    add_symbol(d_sw2.data(), scale);
    const auto& dc = phy::data_carriers();
    const auto& pc = phy::pilot_carriers();
    gr_complex freq[phy::FFT_LEN];
    gr_complex pts[phy::N_DATA];
    auto fill = [&](int n, const gr_complex* data) {
        std::fill(freq, freq + phy::FFT_LEN, gr_complex(0, 0));
        for (int d = 0; d < phy::N_DATA; d++)
            freq[dc[size_t(d)]] = data[d];
        for (int p = 0; p < phy::N_PILOT; p++)
            freq[pc[size_t(p)]] = gr_complex(phy::pilot_value(n, p), 0);
        add_symbol(freq, scale);
    };
    const auto sig = phy::signal_coded_bits(m.index, int(psdu.size()));
    for (int s = 0; s < phy::SIGNAL_SYMBOLS; s++) {
        phy::map_bits(sig.data() + s * phy::N_DATA, 1, phy::N_DATA, pts);
        fill(s, pts);
    }
    const auto bits =
        phy::encode_payload_bits(m, psdu.data(), psdu.size(), phy::SCRAMBLER_SEED);
    const size_t cbps = size_t(m.cbps());
    for (int s = 0; s < n_sym; s++) {
        phy::map_bits(bits.data() + size_t(s) * cbps, m.bpsc, phy::N_DATA, pts);
        fill(phy::SIGNAL_SYMBOLS + s, pts);
    }
    d_burst.insert(d_burst.end(), size_t(d_post), gr_complex(0, 0));
}

bool coded_ofdm_mod_impl::take_next_pdu()
{
    while (true) {
        pmt::pmt_t msg(delete_head_nowait(PORT_IN));
        if (msg.get() == nullptr)
            return false;
        if (!pmt::is_pdu(msg) || !pmt::is_u8vector(pmt::cdr(msg))) {
            d_logger->error("dropping a message that is not a u8 PDU");
            d_dropped++;
            continue;
        }
        const pmt::pmt_t meta = pmt::car(msg);
        const phy::mcs_info* m = nullptr;
        if (pmt::is_dict(meta)) {
            const pmt::pmt_t v = pmt::dict_ref(meta, KEY_MCS, pmt::PMT_NIL);
            if (!pmt::is_null(v)) {
                m = mcs_from_pmt(v);
                if (!m) {
                    d_logger->error("dropping PDU: unknown mcs {:s} in its metadata",
                                    pmt::write_string(v));
                    d_dropped++;
                    continue;
                }
            }
        }
        std::vector<uint8_t> psdu;
        int dst = -1;
        if (d_framing) {
            std::string error;
            if (!detail::pdu_to_frame(msg, d_mtu, d_src, d_dst, d_next_msg_id, psdu, error)) {
                d_logger->error("{:s}", error);
                d_dropped++;
                continue;
            }
            dst = (int(psdu[6]) << 8) | psdu[7]; // the frame's dst field
        } else {
            size_t len = 0;
            const uint8_t* data = pmt::u8vector_elements(pmt::cdr(msg), len);
            if (len < 1 || len > d_mtu) {
                d_logger->error("dropping PDU of {:d} B (must be 1..{:d} B)", len, d_mtu);
                d_dropped++;
                continue;
            }
            psdu.assign(data, data + len);
            if (pmt::is_dict(meta)) {
                const pmt::pmt_t v = pmt::dict_ref(meta, pmt::mp("dst"), pmt::PMT_NIL);
                if (pmt::is_integer(v))
                    dst = int(pmt::to_long(v));
            }
        }
        if (!m)
            m = phy::mcs_by_index(dst_mcs(dst));
        build_burst(*m, psdu);
        d_per_mcs[size_t(m->index)]++;
        return true;
    }
}

int coded_ofdm_mod_impl::calculate_output_stream_length(const gr_vector_int&)
{
    if (d_burst.empty() && !take_next_pdu())
        return 0;
    return int(d_burst.size());
}

int coded_ofdm_mod_impl::work(int noutput_items,
                              gr_vector_int&,
                              gr_vector_const_void_star&,
                              gr_vector_void_star& output_items)
{
    if (d_burst.empty() || size_t(noutput_items) < d_burst.size())
        return 0;
    auto* out = static_cast<gr_complex*>(output_items[0]);
    std::memcpy(out, d_burst.data(), d_burst.size() * sizeof(gr_complex));
    const int n = int(d_burst.size());
    d_burst.clear();
    d_built++;
    return n;
}

} /* namespace scaleflu */
} /* namespace gr */
