/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 *
 * Detection after T. M. Schmidl and D. C. Cox, "Robust frequency and timing synchronization
 * for OFDM", IEEE Trans. Commun. 45(12), 1997 (the metric with the energy of a half symbol,
 * as gr-digital's ofdm_sync_sc_cfb); timing from the cross-correlation with a known training
 * symbol, as in the 802.11a receivers that time on the long training field.
 */

#include "ofdm_preamble_sync_impl.h"
#include <gnuradio/fft/fft.h>
#include <gnuradio/io_signature.h>
#include <cmath>
#include <stdexcept>

namespace gr {
namespace scaleflu {

namespace {
constexpr int PEAK_SPAN = 48;       // samples after a metric crossing searched for its peak
constexpr int SEARCH = 32;          // +- samples of the cross-correlation search
constexpr uint64_t RECOMPUTE = 8192; // exact running sums every so many samples
constexpr size_t MAX_CANDIDATES = 8;  // open candidates at most (noise bursts)
} // namespace

ofdm_preamble_sync::sptr ofdm_preamble_sync::make(int fft_len,
                                                  int cp_len,
                                                  const std::vector<gr_complex>& sync_word1,
    const std::vector<gr_complex>& sync_word2,
                                                  float threshold,
                                                  float min_xcorr,
                                                  int backoff)
{
    return gnuradio::make_block_sptr<ofdm_preamble_sync_impl>(
        fft_len, cp_len, sync_word1, sync_word2, threshold, min_xcorr, backoff);
}

ofdm_preamble_sync_impl::ofdm_preamble_sync_impl(int fft_len,
                                                 int cp_len,
                                                 const std::vector<gr_complex>& sync_word1,
    const std::vector<gr_complex>& sync_word2,
                                                 float threshold,
                                                 float min_xcorr,
                                                 int backoff)
    : gr::sync_block("ofdm_preamble_sync",
                     gr::io_signature::make(1, 1, sizeof(gr_complex)),
                     gr::io_signature::make2(2, 2, sizeof(float), sizeof(char))),
      d_fft(fft_len),
      d_cp(cp_len),
      d_half(fft_len / 2),
      d_sym(fft_len + cp_len),
      d_threshold(threshold),
      d_min_xcorr(min_xcorr),
      d_backoff(backoff),
      d_delay(4 * (fft_len + cp_len)),
      d_hist(8 * (fft_len + cp_len))
{
    if (fft_len < 16 || fft_len % 2)
        throw std::invalid_argument("ofdm_preamble_sync: fft_len must be even and >= 16");
    if (cp_len < 1 || cp_len > fft_len)
        throw std::invalid_argument("ofdm_preamble_sync: cp_len must be in [1, fft_len]");
    if (sync_word1.size() != size_t(fft_len) || sync_word2.size() != size_t(fft_len))
        throw std::invalid_argument("ofdm_preamble_sync: the sync words need fft_len values");
    if (!(threshold > 0 && threshold < 1) || !(min_xcorr > 0 && min_xcorr < 1))
        throw std::invalid_argument("ofdm_preamble_sync: thresholds must be in (0, 1)");
    if (backoff < 0 || backoff > cp_len)
        throw std::invalid_argument("ofdm_preamble_sync: backoff must be in [0, cp_len]");
    // time-domain body of the second sync symbol (sync words are in shifted order)
    gr::fft::fft_complex_rev ifft(fft_len);
    for (int k = 0; k < fft_len; k++)
        ifft.get_inbuf()[(k + fft_len / 2) % fft_len] = sync_word2[size_t(k)];
    ifft.execute();
    d_s2.assign(ifft.get_outbuf(), ifft.get_outbuf() + fft_len);
    // Sync symbol 1 on odd subcarriers (gr-digital's) has halves of opposite sign: the
    // correlation of its halves is then -|P| at zero offset.
    int odd = 0, even = 0;
    for (int k = 0; k < fft_len; k++)
        if (sync_word1[size_t(k)] != gr_complex(0, 0))
            (((k + fft_len / 2) % fft_len) % 2 ? odd : even)++;
    if (odd && even)
        throw std::invalid_argument(
            "ofdm_preamble_sync: sync_word1 must use only even or only odd subcarriers");
    if (!odd && !even)
        throw std::invalid_argument("ofdm_preamble_sync: sync_word1 is all zeros");
    d_sign = odd ? -1.0 : 1.0;
    d_s2_energy = 0;
    for (const auto& v : d_s2)
        d_s2_energy += std::norm(v);
    if (!(d_s2_energy > 0))
        throw std::invalid_argument("ofdm_preamble_sync: sync_word2 is all zeros");
    set_history(unsigned(d_hist));
    set_tag_propagation_policy(TPP_DONT);
}

void ofdm_preamble_sync_impl::recompute(const gr_complex* in, uint64_t base, uint64_t d)
{
    auto y = [&](uint64_t x) { return std::complex<double>(in[x - base]); };
    d_p = 0;
    d_r = 0;
    for (int m = 0; m < d_half; m++) {
        d_p += std::conj(y(d + uint64_t(m))) * y(d + uint64_t(m + d_half));
        d_r += std::norm(y(d + uint64_t(m + d_half)));
    }
}

bool ofdm_preamble_sync_impl::locate(const gr_complex* in, uint64_t base, uint64_t peak_d)
{
    auto y = [&](uint64_t x) { return in[x - base]; };
    // the offset the metric's peak measured, to align the correlation
    std::complex<double> p(0, 0);
    for (int m = 0; m < d_half; m++)
        p += std::conj(std::complex<double>(y(peak_d + uint64_t(m)))) *
             std::complex<double>(y(peak_d + uint64_t(m + d_half)));
    p *= d_sign;
    const float w = float(std::arg(p) / d_half); // radians per sample
    std::vector<gr_complex> ref(static_cast<size_t>(d_fft));
    for (int n = 0; n < d_fft; n++)
        ref[size_t(n)] = std::conj(d_s2[size_t(n)]) * std::polar(1.0f, -w * float(n));
    // the metric plateau spans the first symbol's prefix: its peak is near t0 + cp / 2, and
    // the second symbol's body starts at t0 + sym + cp
    const int64_t centre = int64_t(peak_d) + d_sym + d_cp / 2;
    double best = -1;
    int64_t best_c = centre;
    for (int64_t c = centre - SEARCH; c <= centre + SEARCH; c++) {
        std::complex<double> acc(0, 0);
        double e = 0;
        for (int n = 0; n < d_fft; n++) {
            const gr_complex v = y(uint64_t(c + n));
            acc += std::complex<double>(v * ref[size_t(n)]);
            e += std::norm(v);
        }
        const double rho = e > 0 ? std::norm(acc) / (e * d_s2_energy) : 0.0;
        if (rho > best) {
            best = rho;
            best_c = c;
        }
    }
    if (!(best >= d_min_xcorr))
        return false;
    const int64_t t0 = best_c - d_sym - d_cp; // first sync symbol's prefix
    // fine offset: the half-symbol correlation averaged over the prefix's plateau
    std::complex<double> q(0, 0);
    for (int64_t d = t0 + 1; d < t0 + d_cp; d++)
        for (int m = 0; m < d_half; m++)
            q += std::conj(std::complex<double>(y(uint64_t(d + m)))) *
                 std::complex<double>(y(uint64_t(d + m + d_half)));
    q *= d_sign;
    const int64_t at = t0 - d_backoff + d_delay;
    d_events.emplace_back(uint64_t(at), float(std::arg(q)));
    d_holdoff = uint64_t(t0 + 4 * d_sym); // sync and SIGNAL symbols
    d_detections++;
    return true;
}

int ofdm_preamble_sync_impl::work(int noutput_items,
                                  gr_vector_const_void_star& input_items,
                                  gr_vector_void_star& output_items)
{
    const auto* in = static_cast<const gr_complex*>(input_items[0]);
    auto* freq = static_cast<float*>(output_items[0]);
    auto* trig = static_cast<unsigned char*>(output_items[1]);
    // absolute position x of in[x - base]; the newest sample of output i is at nw + i
    const uint64_t nw = nitems_written(0);
    const uint64_t base = nw + uint64_t(d_hist) - 1; // position + hist - 1 (unsigned-safe)
    const uint64_t off = uint64_t(d_hist) - 1;
    // positions below are shifted by off so that the zero history has positions >= 0
    auto y = [&](uint64_t x) { return std::complex<double>(in[x - (base - off)]); };
    for (int i = 0; i < noutput_items; i++) {
        const uint64_t j = nw + uint64_t(i) + off; // shifted position of the newest sample
        const uint64_t d = j - uint64_t(d_fft - 1); // window start of the metric
        if (!d_primed || ++d_since_recompute >= RECOMPUTE) {
            recompute(in, base - off, d);
            d_primed = true;
            d_since_recompute = 0;
        } else {
            d_p += -std::conj(y(d - 1)) * y(d - 1 + uint64_t(d_half)) +
                   std::conj(y(d + uint64_t(d_half) - 1)) * y(d + uint64_t(d_fft) - 1);
            d_r += -std::norm(y(d - 1 + uint64_t(d_half))) + std::norm(y(d + uint64_t(d_fft) - 1));
        }
        const double m = d_r > 1e-30 ? std::norm(d_p) / (d_r * d_r) : 0.0;
        // Every crossing of the threshold opens a candidate whose metric peak is tracked for
        // PEAK_SPAN samples; each is checked by cross-correlation once the second sync symbol
        // it implies has arrived. Crossings keep opening candidates meanwhile, so noise just
        // before a frame does not hide the frame.
        if (m > d_threshold && d >= d_holdoff) {
            if (!d_cands.empty() && d < d_cands.back().first + PEAK_SPAN) {
                if (m > d_cands.back().best_m) {
                    d_cands.back().best_m = m;
                    d_cands.back().best_d = d;
                }
            } else if (d_cands.size() < MAX_CANDIDATES) {
                d_cands.push_back({ d, d, m });
            }
        }
        const uint64_t need = uint64_t(d_sym + d_cp / 2 + SEARCH + d_fft);
        while (!d_cands.empty()) {
            const candidate c = d_cands.front();
            if (c.best_d < d_holdoff) { // inside a frame found meanwhile
                d_cands.pop_front();
                continue;
            }
            if (d < c.first + PEAK_SPAN || j < c.best_d + need)
                break;
            d_cands.pop_front();
            if (!locate(in, base - off, c.best_d))
                d_rejected++;
        }
        const uint64_t out_pos = nw + uint64_t(i) + off; // events use shifted positions too
        trig[i] = 0;
        while (!d_events.empty() && d_events.front().first < out_pos)
            d_events.pop_front(); // cannot happen with delay() >= the decision lag
        if (!d_events.empty() && d_events.front().first == out_pos) {
            trig[i] = 1;
            d_freq = d_events.front().second;
            d_events.pop_front();
        }
        freq[i] = d_freq;
    }
    return noutput_items;
}

} /* namespace scaleflu */
} /* namespace gr */
