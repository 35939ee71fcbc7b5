/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#include "coded_signal_decoder_impl.h"
#include <gnuradio/io_signature.h>
#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace gr {
namespace scaleflu {

namespace {
const pmt::pmt_t KEY_TAPS = pmt::mp("ofdm_sync_chan_taps");
const pmt::pmt_t KEY_OFFSET = pmt::mp("ofdm_sync_carr_offset");
constexpr int N = phy::FFT_LEN;

// Received value of logical subcarrier index c (shifted order) under an integer carrier
// offset: the FFT bin c + offset, 0 when that falls outside the FFT.
inline gr_complex at(const gr_complex* y, int c, int offset)
{
    const int i = c + offset;
    return (i >= 0 && i < N) ? y[i] : gr_complex(0, 0);
}
} // namespace

coded_signal_decoder::sptr coded_signal_decoder::make(int max_psdu_len,
                                                      const std::string& frame_len_key)
{
    return gnuradio::make_block_sptr<coded_signal_decoder_impl>(max_psdu_len, frame_len_key);
}

coded_signal_decoder_impl::coded_signal_decoder_impl(int max_psdu_len,
                                                     const std::string& frame_len_key)
    : gr::sync_block("coded_signal_decoder",
                     gr::io_signature::make(1, 1, sizeof(gr_complex) * N),
                     gr::io_signature::make(0, 0, 0)),
      d_max_len(size_t(max_psdu_len)),
      d_len_key(pmt::mp(frame_len_key)),
      d_port(pmt::mp("header_data")),
      d_report(pmt::mp("report"))
{
    if (max_psdu_len < 1 || size_t(max_psdu_len) > phy::MAX_PSDU_LEN)
        throw std::invalid_argument("coded_signal_decoder: max_psdu_len must be in [1, 65535]");
    message_port_register_out(d_port);
    message_port_register_out(d_report);
    set_output_multiple(phy::SIGNAL_SYMBOLS);
    set_tag_propagation_policy(TPP_DONT);
}

void coded_signal_decoder_impl::publish(const pmt::pmt_t& verdict)
{
    if (d_demux)
        d_demux->header_data(verdict);
    else
        message_port_pub(d_port, verdict);
}

void coded_signal_decoder_impl::reject(const char* reason)
{
    publish(pmt::PMT_F);
    pmt::pmt_t r = pmt::make_dict();
    r = pmt::dict_add(r, pmt::mp("header_ok"), pmt::PMT_F);
    r = pmt::dict_add(r, pmt::mp("reason"), pmt::mp(reason));
    if (d_node >= 0)
        r = pmt::dict_add(r, pmt::mp("node"), pmt::from_long(d_node));
    message_port_pub(d_report, r);
}

void coded_signal_decoder_impl::decode(const gr_complex* y0,
                                       const gr_complex* y1,
                                       const std::vector<tag_t>& tags)
{
    d_headers++;
    pmt::pmt_t taps = pmt::PMT_NIL;
    int offset = 0;
    for (const auto& t : tags) {
        if (pmt::eqv(t.key, KEY_TAPS) && pmt::is_c32vector(t.value) &&
            pmt::length(t.value) == size_t(N))
            taps = t.value;
        else if (pmt::eqv(t.key, KEY_OFFSET) && pmt::is_integer(t.value))
            offset = int(pmt::to_long(t.value));
    }
    if (pmt::is_null(taps) || std::abs(offset) >= N) {
        d_no_channel++;
        reject("no channel estimate");
        return;
    }
    size_t nt = 0;
    const gr_complex* h = pmt::c32vector_elements(taps, nt);
    const auto& dc = phy::data_carriers();
    const auto& pc = phy::pilot_carriers();
    const gr_complex* ys[2] = { y0, y1 };

    // The SIGNAL is decoded with the sync symbol's channel estimate denoised (channel_smoother);
    // if that fails, with the raw estimate (a channel longer than the smoother's window).
    std::vector<gr_complex> hs(h, h + N);
    d_smoother.smooth(hs.data());
    phy::signal_field f;
    phy::signal_status st = phy::signal_status::CRC;
    for (const gr_complex* hh : { (const gr_complex*)hs.data(), h }) {
        // common phase of each SIGNAL symbol from its pilots, then BPSK LLRs (|H|^2 weighted)
        float llr[2 * phy::N_DATA];
        for (int s = 0; s < 2; s++) {
            gr_complex c(0, 0);
            for (int p = 0; p < phy::N_PILOT; p++)
                c += at(ys[s], pc[size_t(p)], offset) * std::conj(hh[pc[size_t(p)]]) *
                     phy::pilot_value(s, p);
            const gr_complex rot =
                std::abs(c) > 0 ? std::conj(c) / std::abs(c) : gr_complex(1, 0);
            gr_complex yd[phy::N_DATA], hd[phy::N_DATA];
            for (int d = 0; d < phy::N_DATA; d++) {
                yd[d] = at(ys[s], dc[size_t(d)], offset) * rot;
                hd[d] = hh[dc[size_t(d)]];
            }
            phy::demap_llr(yd, hd, 1.0f, 1, phy::N_DATA, llr + s * phy::N_DATA);
        }
        st = phy::decode_signal(llr, d_max_len, f, d_vd);
        if (st != phy::signal_status::CRC)
            break;
    }
    switch (st) {
    case phy::signal_status::OK:
        break;
    case phy::signal_status::CRC:
        d_crc++;
        reject(phy::signal_status_name(st));
        return;
    case phy::signal_status::VERSION:
        d_version++;
        reject(phy::signal_status_name(st));
        return;
    case phy::signal_status::UNKNOWN_MCS:
        d_unknown++;
        reject(phy::signal_status_name(st));
        return;
    case phy::signal_status::BAD_LENGTH:
        d_length++;
        reject(phy::signal_status_name(st));
        return;
    }
    const phy::mcs_info& m = *phy::mcs_by_index(f.mcs);

    // The SIGNAL symbols are now known: two more channel estimates per subcarrier. Rotate
    // each onto the sync symbol's phase, average the three, and take the noise from their
    // spread (2 degrees of freedom per subcarrier, 104 in all).
    const auto coded = phy::signal_coded_bits(f.mcs, f.length);
    std::vector<int> occ(dc.begin(), dc.end());
    occ.insert(occ.end(), pc.begin(), pc.end());
    gr_complex est[2][N];
    for (int s = 0; s < 2; s++) {
        for (int d = 0; d < phy::N_DATA; d++) // BPSK: x = +-1, y / x = y * x
            est[s][dc[size_t(d)]] = at(ys[s], dc[size_t(d)], offset) *
                                    (coded[size_t(s * phy::N_DATA + d)] ? 1.0f : -1.0f);
        for (int p = 0; p < phy::N_PILOT; p++)
            est[s][pc[size_t(p)]] = at(ys[s], pc[size_t(p)], offset) * phy::pilot_value(s, p);
        gr_complex c(0, 0);
        for (int k : occ)
            c += est[s][k] * std::conj(h[k]);
        const gr_complex r = std::abs(c) > 0 ? std::conj(c) / std::abs(c) : gr_complex(1, 0);
        for (int k : occ)
            est[s][k] *= r;
    }
    std::vector<gr_complex> hbar(size_t(N), gr_complex(0, 0));
    double spread = 0, power = 0;
    for (int k : occ) {
        const gr_complex mean = (h[k] + est[0][k] + est[1][k]) / 3.0f;
        hbar[size_t(k)] = mean;
        spread += std::norm(h[k] - mean) + std::norm(est[0][k] - mean) +
                  std::norm(est[1][k] - mean);
        power += std::norm(mean);
    }
    const double n_occ = double(occ.size());
    double noise = spread / (2.0 * n_occ);
    double signal = power / n_occ - noise / 3.0;
    if (!(signal > 0))
        signal = power / n_occ;
    noise = std::max(noise, signal * 1e-6); // at most 60 dB
    // Denoise the averaged estimate unless the channel is longer than the smoother's window:
    // then what the projection removes is well above the noise it should remove.
    std::vector<gr_complex> smooth(hbar);
    const double resid = d_smoother.smooth(smooth.data());
    const double expect = noise / 3.0 * (1.0 - double(d_smoother.taps()) / n_occ);
    if (resid <= 2.0 * expect + 1e-4 * signal)
        hbar.swap(smooth);
    const double snr_db = 10.0 * std::log10(signal / noise * phy::N_OCCUPIED / N);

    pmt::pmt_t v = pmt::make_dict();
    v = pmt::dict_add(v, d_len_key, pmt::from_long(phy::payload_symbols(m, size_t(f.length))));
    v = pmt::dict_add(v, pmt::mp("mcs"), pmt::from_long(f.mcs));
    v = pmt::dict_add(v, pmt::mp("psdu_len"), pmt::from_long(f.length));
    v = pmt::dict_add(v, KEY_OFFSET, pmt::from_long(offset));
    v = pmt::dict_add(v, pmt::mp("chan_est"), pmt::init_c32vector(size_t(N), hbar));
    v = pmt::dict_add(v, pmt::mp("noise_var"), pmt::from_double(noise));
    v = pmt::dict_add(v, pmt::mp("snr_db"), pmt::from_double(snr_db));
    d_passed++;
    publish(v);
}

int coded_signal_decoder_impl::work(int noutput_items,
                                    gr_vector_const_void_star& input_items,
                                    gr_vector_void_star&)
{
    const auto* in = static_cast<const gr_complex*>(input_items[0]);
    const int frames = noutput_items / phy::SIGNAL_SYMBOLS;
    std::vector<tag_t> tags;
    for (int i = 0; i < frames; i++) {
        const uint64_t at0 = nitems_read(0) + uint64_t(i * phy::SIGNAL_SYMBOLS);
        get_tags_in_range(tags, 0, at0, at0 + 1);
        const gr_complex* y0 = in + size_t(i * phy::SIGNAL_SYMBOLS) * N;
        decode(y0, y0 + N, tags);
    }
    return frames * phy::SIGNAL_SYMBOLS;
}

} /* namespace scaleflu */
} /* namespace gr */
