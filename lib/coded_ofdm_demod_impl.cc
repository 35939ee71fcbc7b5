/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#include "coded_ofdm_demod_impl.h"
#include <gnuradio/io_signature.h>
#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace gr {
namespace scaleflu {

namespace {
const pmt::pmt_t PORT_OUT = pmt::mp("out");
const pmt::pmt_t PORT_REPORT = pmt::mp("report");
const pmt::pmt_t PORT_SYMBOLS = pmt::mp("symbols");
const pmt::pmt_t KEY_MCS = pmt::mp("mcs");
const pmt::pmt_t KEY_LEN = pmt::mp("psdu_len");
const pmt::pmt_t KEY_CHAN = pmt::mp("chan_est");
const pmt::pmt_t KEY_NOISE = pmt::mp("noise_var");
const pmt::pmt_t KEY_SNR = pmt::mp("snr_db");
const pmt::pmt_t KEY_OFFSET = pmt::mp("ofdm_sync_carr_offset");
constexpr int N = phy::FFT_LEN;
constexpr int SMOOTH = 4;        // common phase averaged over +-4 symbols
constexpr int SLOPE_SMOOTH = 16; // phase slope across subcarriers over +-16 symbols

inline gr_complex at(const gr_complex* y, int c, int offset)
{
    const int i = c + offset;
    return (i >= 0 && i < N) ? y[i] : gr_complex(0, 0);
}

bool tag_long(const std::vector<tag_t>& tags, const pmt::pmt_t& key, long& out)
{
    for (const auto& t : tags)
        if (pmt::eqv(t.key, key) && pmt::is_integer(t.value)) {
            out = pmt::to_long(t.value);
            return true;
        }
    return false;
}

bool tag_double(const std::vector<tag_t>& tags, const pmt::pmt_t& key, double& out)
{
    for (const auto& t : tags)
        if (pmt::eqv(t.key, key) && pmt::is_number(t.value)) {
            out = pmt::to_double(t.value);
            return true;
        }
    return false;
}
} // namespace

coded_ofdm_demod::sptr
coded_ofdm_demod::make(int max_psdu_len, const std::string& frame_len_key, int symbols_out)
{
    return gnuradio::make_block_sptr<coded_ofdm_demod_impl>(
        max_psdu_len, frame_len_key, symbols_out);
}

coded_ofdm_demod_impl::coded_ofdm_demod_impl(int max_psdu_len,
                                             const std::string& frame_len_key,
                                             int symbols_out)
    : gr::sync_block("coded_ofdm_demod",
                     gr::io_signature::make(1, 1, sizeof(gr_complex) * N),
                     gr::io_signature::make(0, 0, 0)),
      d_max_len(size_t(max_psdu_len)),
      d_len_key(pmt::mp(frame_len_key)),
      d_symbols_out(std::max(symbols_out, 0)),
      d_max_sym(max_psdu_len >= 1 && size_t(max_psdu_len) <= phy::MAX_PSDU_LEN
                    ? phy::payload_symbols(*phy::mcs_by_index(0), size_t(max_psdu_len))
                    : 0),
      d_h(size_t(N)),
      d_ok_per_mcs(size_t(phy::mcs_count()))
{
    if (max_psdu_len < 1 || size_t(max_psdu_len) > phy::MAX_PSDU_LEN)
        throw std::invalid_argument("coded_ofdm_demod: max_psdu_len must be in [1, 65535]");
    for (auto& c : d_ok_per_mcs)
        c = 0;
    message_port_register_out(PORT_OUT);
    message_port_register_out(PORT_REPORT);
    message_port_register_out(PORT_SYMBOLS);
    set_tag_propagation_policy(TPP_DONT);
}

std::vector<uint64_t> coded_ofdm_demod_impl::frames_ok_per_mcs() const
{
    std::vector<uint64_t> out;
    for (const auto& c : d_ok_per_mcs)
        out.push_back(c);
    return out;
}

bool coded_ofdm_demod_impl::start_frame(const std::vector<tag_t>& tags)
{
    long n_sym = 0, mcs = -1, len = 0, offset = 0;
    double noise = 0, snr = 0;
    pmt::pmt_t chan = pmt::PMT_NIL;
    for (const auto& t : tags)
        if (pmt::eqv(t.key, KEY_CHAN) && pmt::is_c32vector(t.value) &&
            pmt::length(t.value) == size_t(N))
            chan = t.value;
    if (!tag_long(tags, d_len_key, n_sym) || !tag_long(tags, KEY_MCS, mcs) ||
        !tag_long(tags, KEY_LEN, len) || !tag_double(tags, KEY_NOISE, noise) ||
        pmt::is_null(chan))
        return false;
    tag_long(tags, KEY_OFFSET, offset);
    tag_double(tags, KEY_SNR, snr);
    const phy::mcs_info* m = phy::mcs_by_index(int(mcs));
    if (!m || len < 1 || size_t(len) > d_max_len || std::abs(offset) >= N ||
        !(noise > 0) || !std::isfinite(noise) ||
        n_sym != phy::payload_symbols(*m, size_t(len)) || n_sym > d_max_sym)
        return false;
    size_t nc = 0;
    const gr_complex* h = pmt::c32vector_elements(chan, nc);
    std::copy(h, h + N, d_h.begin());
    d_active = true;
    d_n_sym = int(n_sym);
    d_mcs = int(mcs);
    d_len = int(len);
    d_offset = int(offset);
    d_noise = noise;
    d_snr_db = snr;
    d_syms.clear();
    d_syms.reserve(size_t(n_sym) * N);
    return true;
}

void coded_ofdm_demod_impl::finish_frame()
{
    d_active = false;
    const phy::mcs_info& m = *phy::mcs_by_index(d_mcs);
    const int ns = d_n_sym;
    const auto& dc = phy::data_carriers();
    const auto& pc = phy::pilot_carriers();
    const auto& psc = phy::pilot_subcarriers();

    // Pilot phasors q[n][p] = y conj(H x): their phase is the residual rotation.
    std::vector<gr_complex> q(size_t(ns) * phy::N_PILOT);
    for (int n = 0; n < ns; n++) {
        const gr_complex* y = &d_syms[size_t(n) * N];
        for (int p = 0; p < phy::N_PILOT; p++)
            q[size_t(n * phy::N_PILOT + p)] =
                at(y, pc[size_t(p)], d_offset) * std::conj(d_h[pc[size_t(p)]]) *
                phy::pilot_value(phy::SIGNAL_SYMBOLS + n, p);
    }
    // Residual carrier offset: the mean rotation per symbol over the frame, all pilots.
    double wc = 0;
    if (ns >= 2) {
        gr_complex acc(0, 0);
        for (int n = 0; n + 1 < ns; n++)
            for (int p = 0; p < phy::N_PILOT; p++)
                acc += q[size_t((n + 1) * phy::N_PILOT + p)] *
                       std::conj(q[size_t(n * phy::N_PILOT + p)]);
        wc = std::abs(acc) > 0 ? std::arg(acc) : 0.0;
    }
    // What is left per symbol: a common phase (smoothed over +-SMOOTH symbols) and a phase
    // slope across subcarriers (a sample-clock offset; it changes slowly, so it is fitted
    // to the pilots smoothed over +-SLOPE_SMOOTH symbols). Prefix sums per pilot.
    const size_t np = phy::N_PILOT;
    std::vector<gr_complex> cum((size_t(ns) + 1) * np, gr_complex(0, 0));
    for (int n = 0; n < ns; n++) {
        const gr_complex r = std::polar(1.0f, float(-wc * n));
        for (size_t p = 0; p < np; p++)
            cum[(size_t(n) + 1) * np + p] = cum[size_t(n) * np + p] + q[size_t(n) * np + p] * r;
    }
    auto window = [&](int n, int w, size_t p) {
        const int lo = std::max(0, n - w), hi = std::min(ns, n + w + 1);
        return cum[size_t(hi) * np + p] - cum[size_t(lo) * np + p];
    };
    const size_t bpsc = size_t(m.bpsc);
    std::vector<float> llr(size_t(ns) * size_t(m.cbps()));
    std::vector<gr_complex> eq; // equalised points for the "symbols" port
    gr_complex yd[phy::N_DATA], hd[phy::N_DATA];
    for (int d = 0; d < phy::N_DATA; d++)
        hd[d] = d_h[dc[size_t(d)]];
    for (int n = 0; n < ns; n++) {
        gr_complex cs(0, 0), cl(0, 0);
        gr_complex lp[phy::N_PILOT];
        for (size_t p = 0; p < np; p++) {
            cs += window(n, SMOOTH, p);
            lp[p] = window(n, SLOPE_SMOOTH, p);
            cl += lp[p];
        }
        const double alpha = std::abs(cs) > 0 ? std::arg(cs) : 0.0;
        double num = 0, den = 0;
        for (size_t p = 0; p < np; p++) {
            const double w = std::abs(lp[p]);
            if (w > 0 && std::abs(cl) > 0) {
                num += w * psc[p] * std::arg(lp[p] * std::conj(cl));
                den += w * double(psc[p]) * psc[p];
            }
        }
        const double beta = den > 0 ? num / den : 0.0;
        const gr_complex* y = &d_syms[size_t(n) * N];
        for (int d = 0; d < phy::N_DATA; d++) {
            const int k = dc[size_t(d)];
            const double theta = alpha + wc * n + beta * (k - N / 2);
            yd[d] = at(y, k, d_offset) * std::polar(1.0f, float(-theta));
        }
        phy::demap_llr(
            yd, hd, float(d_noise), m.bpsc, phy::N_DATA, &llr[size_t(n) * phy::N_DATA * bpsc]);
        for (int d = 0; d < phy::N_DATA && eq.size() < size_t(d_symbols_out); d++)
            if (std::norm(hd[d]) > 0)
                eq.push_back(yd[d] / hd[d]);
    }
    std::vector<uint8_t> psdu;
    const bool ok =
        phy::decode_payload_bits(m, llr.data(), size_t(d_len), phy::SCRAMBLER_SEED, psdu, d_vd);
    d_last_snr = d_snr_db;
    if (ok) {
        d_ok++;
        d_ok_per_mcs[size_t(d_mcs)]++;
    } else {
        d_crc++;
    }
    pmt::pmt_t r = pmt::make_dict();
    r = pmt::dict_add(r, pmt::mp("header_ok"), pmt::PMT_T);
    r = pmt::dict_add(r, pmt::mp("crc_ok"), pmt::from_bool(ok));
    r = pmt::dict_add(r, KEY_MCS, pmt::from_long(d_mcs));
    r = pmt::dict_add(r, KEY_SNR, pmt::from_double(d_snr_db));
    r = pmt::dict_add(r, KEY_LEN, pmt::from_long(d_len));
    r = pmt::dict_add(r, pmt::mp("n_sym"), pmt::from_long(ns));
    if (d_node >= 0)
        r = pmt::dict_add(r, pmt::mp("node"), pmt::from_long(d_node));
    if (ok) {
        pmt::pmt_t meta = pmt::make_dict();
        meta = pmt::dict_add(meta, KEY_MCS, pmt::from_long(d_mcs));
        meta = pmt::dict_add(meta, KEY_SNR, pmt::from_double(d_snr_db));
        meta = pmt::dict_add(meta, KEY_LEN, pmt::from_long(d_len));
        meta = pmt::dict_add(meta, pmt::mp("crc_ok"), pmt::PMT_T);
        message_port_pub(PORT_OUT, pmt::cons(meta, pmt::init_u8vector(psdu.size(), psdu)));
    }
    message_port_pub(PORT_REPORT, r);
    if (!eq.empty())
        message_port_pub(PORT_SYMBOLS,
                         pmt::cons(pmt::make_dict(), pmt::init_c32vector(eq.size(), eq)));
}

int coded_ofdm_demod_impl::work(int noutput_items,
                                gr_vector_const_void_star& input_items,
                                gr_vector_void_star&)
{
    const auto* in = static_cast<const gr_complex*>(input_items[0]);
    const uint64_t base = nitems_read(0);
    std::vector<tag_t> all;
    get_tags_in_range(all, 0, base, base + uint64_t(noutput_items), d_len_key);
    std::vector<uint64_t> starts;
    for (const auto& t : all)
        starts.push_back(t.offset);
    std::sort(starts.begin(), starts.end());
    size_t next = 0;
    std::vector<tag_t> tags;
    for (int i = 0; i < noutput_items; i++) {
        const uint64_t pos = base + uint64_t(i);
        while (next < starts.size() && starts[next] < pos)
            next++;
        if (next < starts.size() && starts[next] == pos) {
            if (d_active) { // the previous frame was cut off
                d_bad++;
                d_active = false;
            }
            get_tags_in_range(tags, 0, pos, pos + 1);
            if (!start_frame(tags))
                d_bad++;
        }
        if (!d_active)
            continue;
        d_syms.insert(d_syms.end(), in + size_t(i) * N, in + size_t(i + 1) * N);
        if (d_syms.size() == size_t(d_n_sym) * N)
            finish_frame();
    }
    return noutput_items;
}

} /* namespace scaleflu */
} /* namespace gr */
