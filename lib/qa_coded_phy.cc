/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#include <gnuradio/scaleflu/coded_phy.h>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>

using namespace gr::scaleflu::phy;

namespace {
std::vector<uint8_t> random_bits(std::mt19937& rng, size_t n)
{
    std::vector<uint8_t> b(n);
    for (auto& x : b)
        x = uint8_t(rng() & 1);
    return b;
}
// Ideal LLRs of coded bits through BPSK at amplitude a (noise-free).
std::vector<float> ideal_llr(const std::vector<uint8_t>& bits, float a = 4.0f)
{
    std::vector<float> l(bits.size());
    for (size_t i = 0; i < bits.size(); i++)
        l[i] = bits[i] ? a : -a;
    return l;
}
} // namespace

BOOST_AUTO_TEST_CASE(mcs_table_is_consistent)
{
    BOOST_CHECK_EQUAL(MCS_TABLE_VERSION, 1);
    BOOST_REQUIRE_EQUAL(mcs_count(), 9);
    std::set<std::string> names;
    for (int i = 0; i < mcs_count(); i++) {
        const mcs_info* m = mcs_by_index(i);
        BOOST_REQUIRE(m);
        BOOST_CHECK_EQUAL(m->index, i);
        names.insert(m->name);
        BOOST_CHECK(mcs_by_name(m->name) == m);
        BOOST_CHECK_EQUAL(m->cbps() % 16, 0);
    }
    BOOST_CHECK_EQUAL(names.size(), size_t(mcs_count()));
    BOOST_CHECK(mcs_by_index(9) == nullptr);
    BOOST_CHECK(mcs_by_index(-1) == nullptr);
    BOOST_CHECK(mcs_by_name("QPSK-3/4") == mcs_by_index(3));
    BOOST_CHECK(mcs_by_name("qpsk") == nullptr);
    // data bits per OFDM symbol: 802.11a's 6 .. 54 Mbit/s modes at 4 us per symbol
    const int dbps[] = { 24, 36, 48, 72, 96, 144, 192, 216, 96 };
    for (int i = 0; i < mcs_count(); i++)
        BOOST_CHECK_EQUAL(mcs_by_index(i)->dbps(), dbps[i]);
    BOOST_CHECK(!mcs_by_index(8)->coded());
    // 1500 B at BPSK 1/2: (8 * 1504 + 6) / 24 -> 502 symbols
    BOOST_CHECK_EQUAL(payload_symbols(*mcs_by_index(0), 1500), 502);
    BOOST_CHECK_EQUAL(payload_symbols(*mcs_by_index(8), 1500), 126);
}

BOOST_AUTO_TEST_CASE(crc16_check_value)
{
    const char* s = "123456789";
    BOOST_CHECK_EQUAL(crc16(reinterpret_cast<const uint8_t*>(s), 9), 0x29B1);
}

BOOST_AUTO_TEST_CASE(scrambler_sequence_is_802_11a)
{
    // 802.11a 17.3.5.4: from the all-ones state the 127-bit sequence starts
    // 00001110 11110010 11001001 and is periodic with period 127.
    std::vector<uint8_t> z(254, 0);
    scramble(z.data(), z.size(), 0x7F);
    const char* want = "000011101111001011001001";
    for (int i = 0; i < 24; i++)
        BOOST_CHECK_EQUAL(int(z[size_t(i)]), want[i] - '0');
    for (int i = 0; i < 127; i++)
        BOOST_CHECK_EQUAL(z[size_t(i)], z[size_t(i + 127)]);
    // pilot polarity: the same sequence, 0 -> +1 (gr-digital's _pilot_sym_scramble_seq)
    const float p0[] = { 1, 1, 1, 1, -1, -1, -1, 1 };
    for (int n = 0; n < 8; n++) {
        BOOST_CHECK_EQUAL(pilot_value(n, 0), p0[n]);
        BOOST_CHECK_EQUAL(pilot_value(n, 3), -p0[n]);
    }
    BOOST_CHECK_THROW(scramble(z.data(), 1, 0), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(encoder_impulse_response_is_the_generators)
{
    // a single 1 followed by zeros gives g0 = 1011011 and g1 = 1111001 (octal 133, 171)
    std::vector<uint8_t> in(7, 0), out(14);
    in[0] = 1;
    conv_encode(in.data(), in.size(), out.data());
    const char* a = "1011011";
    const char* b = "1111001";
    for (int i = 0; i < 7; i++) {
        BOOST_CHECK_EQUAL(int(out[size_t(2 * i)]), a[i] - '0');
        BOOST_CHECK_EQUAL(int(out[size_t(2 * i + 1)]), b[i] - '0');
    }
}

BOOST_AUTO_TEST_CASE(viterbi_decodes_every_rate_without_noise)
{
    std::mt19937 rng(7);
    viterbi_decoder vd;
    const int rates[3][2] = { { 1, 2 }, { 2, 3 }, { 3, 4 } };
    for (const auto& r : rates) {
        const size_t n = 600; // a multiple of every puncturing period
        auto bits = random_bits(rng, n);
        for (size_t i = n - 6; i < n; i++)
            bits[i] = 0;
        std::vector<uint8_t> mother(2 * n), punct(punctured_len(n, r[0], r[1]));
        conv_encode(bits.data(), n, mother.data());
        puncture(mother.data(), n, r[0], r[1], punct.data());
        const auto l = ideal_llr(punct);
        std::vector<float> dep(2 * n);
        depuncture(l.data(), n, r[0], r[1], dep.data());
        std::vector<uint8_t> dec(n);
        vd.decode(dep.data(), n, dec.data());
        BOOST_CHECK(dec == bits);
    }
    BOOST_CHECK_THROW(punctured_len(10, 5, 6), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(viterbi_corrects_errors)
{
    // rate 1/2 has free distance 10: well separated single wrong LLRs are corrected
    std::mt19937 rng(11);
    viterbi_decoder vd;
    const size_t n = 2000;
    auto bits = random_bits(rng, n);
    for (size_t i = n - 6; i < n; i++)
        bits[i] = 0;
    std::vector<uint8_t> mother(2 * n);
    conv_encode(bits.data(), n, mother.data());
    auto l = ideal_llr(mother, 1.0f);
    for (size_t i = 5; i < 2 * n; i += 37)
        l[i] = -l[i] * 0.9f; // 108 wrong decisions
    std::vector<uint8_t> dec(n);
    vd.decode(l.data(), n, dec.data());
    BOOST_CHECK(dec == bits);
}

BOOST_AUTO_TEST_CASE(interleaver_is_a_permutation_and_matches_802_11a)
{
    for (int bpsc : { 1, 2, 4, 6 }) {
        const auto m = interleaver_map(48 * bpsc, bpsc);
        std::set<int> s(m.begin(), m.end());
        BOOST_CHECK_EQUAL(s.size(), m.size());
        BOOST_CHECK_EQUAL(*s.begin(), 0);
        BOOST_CHECK_EQUAL(*s.rbegin(), 48 * bpsc - 1);
    }
    // BPSK (cbps 48): k -> 3 (k mod 16) + floor(k / 16)
    const auto m1 = interleaver_map(48, 1);
    BOOST_CHECK_EQUAL(m1[1], 3);
    BOOST_CHECK_EQUAL(m1[16], 1);
    // 16-QAM (cbps 192, s 2): k = 1 -> i = 12 -> j = 12 + (12 + 192 - 1) % 2 = 13
    const auto m4 = interleaver_map(192, 4);
    BOOST_CHECK_EQUAL(m4[1], 13);
    BOOST_CHECK_EQUAL(m4[0], 0);
}

BOOST_AUTO_TEST_CASE(constellations_are_gray_and_unit_power)
{
    for (int bpsc : { 1, 2, 4, 6 }) {
        const size_t m = size_t(1) << bpsc;
        std::vector<gr_complex> pts(m);
        double power = 0;
        for (size_t v = 0; v < m; v++) {
            uint8_t b[6];
            for (int q = 0; q < bpsc; q++)
                b[q] = (v >> (bpsc - 1 - q)) & 1;
            map_bits(b, bpsc, 1, &pts[v]);
            power += std::norm(pts[v]);
        }
        BOOST_CHECK_CLOSE(power / double(m), 1.0, 1e-4);
        // Gray: nearest neighbours differ in exactly one bit
        const float step = 2.0f * constellation_scale(bpsc);
        for (size_t a = 0; a < m; a++)
            for (size_t b = 0; b < m; b++)
                if (a != b && std::abs(std::abs(pts[a] - pts[b]) - step) < 1e-4f)
                    BOOST_CHECK_EQUAL(__builtin_popcount(unsigned(a ^ b)), 1);
    }
    // 802.11a table 17-9: 16-QAM b0b1 = 10 -> I = +3, b2b3 = 01 -> Q = -1
    const uint8_t b[4] = { 1, 0, 0, 1 };
    gr_complex x;
    map_bits(b, 4, 1, &x);
    BOOST_CHECK_CLOSE(x.real(), 3.0f / std::sqrt(10.0f), 1e-3);
    BOOST_CHECK_CLOSE(x.imag(), -1.0f / std::sqrt(10.0f), 1e-3);
}

BOOST_AUTO_TEST_CASE(llr_signs_and_scale)
{
    std::mt19937 rng(5);
    for (int bpsc : { 1, 2, 4, 6 }) {
        const size_t n = 200;
        auto bits = random_bits(rng, n * size_t(bpsc));
        std::vector<gr_complex> x(n), y(n), h(n);
        map_bits(bits.data(), bpsc, n, x.data());
        for (size_t i = 0; i < n; i++) {
            h[i] = std::polar(0.5f + float(i % 7) * 0.3f, float(i) * 0.7f);
            y[i] = x[i] * h[i];
        }
        std::vector<float> l(n * size_t(bpsc));
        demap_llr(y.data(), h.data(), 0.1f, bpsc, n, l.data());
        for (size_t i = 0; i < l.size(); i++)
            BOOST_CHECK_EQUAL(l[i] > 0, bits[i] == 1);
        // scale: LLRs are proportional to 1 / noise_var
        std::vector<float> l2(l.size());
        demap_llr(y.data(), h.data(), 0.2f, bpsc, n, l2.data());
        for (size_t i = 0; i < l.size(); i++)
            BOOST_CHECK_CLOSE(l2[i] * 2.0f, l[i], 1e-3);
    }
    // BPSK: L = 4 Re(y h*) / noise_var
    const gr_complex y(0.3f, 0.4f), h(2.0f, -1.0f);
    float l;
    demap_llr(&y, &h, 0.5f, 1, 1, &l);
    BOOST_CHECK_CLOSE(l, 4.0f * (0.3f * 2.0f - 0.4f * 1.0f) / 0.5f, 1e-3);
    // a zero channel gives no information
    const gr_complex z(0, 0);
    float l4[4];
    demap_llr(&y, &z, 0.5f, 4, 1, l4);
    for (float v : l4)
        BOOST_CHECK_EQUAL(v, 0.0f);
}

BOOST_AUTO_TEST_CASE(signal_round_trip_and_rejections)
{
    viterbi_decoder vd;
    for (int mcs = 0; mcs < mcs_count(); mcs++) {
        for (int len : { 1, 26, 1500, 65535 }) {
            const auto coded = signal_coded_bits(mcs, len);
            BOOST_REQUIRE_EQUAL(coded.size(), 96u);
            const auto l = ideal_llr(coded);
            signal_field f;
            BOOST_CHECK(decode_signal(l.data(), 65535, f, vd) == signal_status::OK);
            BOOST_CHECK_EQUAL(f.mcs, mcs);
            BOOST_CHECK_EQUAL(f.length, len);
            if (len > 1500)
                BOOST_CHECK(decode_signal(l.data(), 1500, f, vd) == signal_status::BAD_LENGTH);
        }
    }
    BOOST_CHECK_THROW(signal_bytes(9, 10), std::invalid_argument);
    BOOST_CHECK_THROW(signal_bytes(0, 0), std::invalid_argument);
    signal_field f;
    auto b = signal_bytes(3, 100);
    BOOST_CHECK(parse_signal(b.data(), 1500, f) == signal_status::OK);
    b[1] ^= 1;
    BOOST_CHECK(parse_signal(b.data(), 1500, f) == signal_status::CRC);
    // another table version, an unknown MCS, length 0: valid CRC, still rejected
    auto with_crc = [](uint8_t b0, int len) {
        std::array<uint8_t, 5> x{ b0, uint8_t(len >> 8), uint8_t(len), 0, 0 };
        const uint16_t c = crc16(x.data(), 3);
        x[3] = uint8_t(c >> 8);
        x[4] = uint8_t(c);
        return x;
    };
    auto v2 = with_crc(uint8_t((2 << 5) | 3), 100);
    BOOST_CHECK(parse_signal(v2.data(), 1500, f) == signal_status::VERSION);
    auto unk = with_crc(uint8_t((MCS_TABLE_VERSION << 5) | 17), 100);
    BOOST_CHECK(parse_signal(unk.data(), 1500, f) == signal_status::UNKNOWN_MCS);
    auto zero = with_crc(uint8_t((MCS_TABLE_VERSION << 5) | 3), 0);
    BOOST_CHECK(parse_signal(zero.data(), 1500, f) == signal_status::BAD_LENGTH);
    BOOST_CHECK(std::string(signal_status_name(signal_status::UNKNOWN_MCS)) == "unknown mcs");
}

BOOST_AUTO_TEST_CASE(random_signal_llrs_are_rejected)
{
    // noise instead of a SIGNAL field: never accepted (CRC-16 and zero tail)
    std::mt19937 rng(99);
    std::normal_distribution<float> g(0.0f, 3.0f);
    viterbi_decoder vd;
    int accepted = 0;
    for (int i = 0; i < 20000; i++) {
        float l[96];
        for (float& v : l)
            v = g(rng);
        signal_field f;
        if (decode_signal(l, 1500, f, vd) == signal_status::OK)
            accepted++;
    }
    BOOST_CHECK_EQUAL(accepted, 0);
}

BOOST_AUTO_TEST_CASE(payload_round_trip_every_mcs)
{
    std::mt19937 rng(3);
    viterbi_decoder vd;
    for (int mcs = 0; mcs < mcs_count(); mcs++) {
        const mcs_info& m = *mcs_by_index(mcs);
        for (size_t len : { size_t(1), size_t(77), size_t(1500) }) {
            std::vector<uint8_t> psdu(len);
            for (auto& x : psdu)
                x = uint8_t(rng());
            const auto bits = encode_payload_bits(m, psdu.data(), len, SCRAMBLER_SEED);
            BOOST_REQUIRE_EQUAL(bits.size(), size_t(payload_symbols(m, len) * m.cbps()));
            const auto l = ideal_llr(bits);
            std::vector<uint8_t> out;
            BOOST_CHECK(decode_payload_bits(m, l.data(), len, SCRAMBLER_SEED, out, vd));
            BOOST_CHECK(out == psdu);
            auto bad = l;
            bad[0] = -bad[0];
            bad[1] = -bad[1];
            bad[2] = -bad[2];
            if (!m.coded()) // uncoded: any flipped bit fails the CRC
                BOOST_CHECK(!decode_payload_bits(m, bad.data(), len, SCRAMBLER_SEED, out, vd));
        }
    }
}

BOOST_AUTO_TEST_CASE(viterbi_simd_kernel_matches_the_scalar_one)
{
    // noisy LLRs (many wrong signs): the SIMD kernel of this CPU decides as the scalar one
    std::mt19937 rng(21);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const size_t n = 5000;
    auto bits = random_bits(rng, n);
    std::vector<uint8_t> mother(2 * n);
    conv_encode(bits.data(), n, mother.data());
    std::vector<float> l(2 * n);
    for (size_t i = 0; i < l.size(); i++)
        l[i] = (mother[i] ? 1.0f : -1.0f) + 1.2f * g(rng);
    viterbi_decoder vd;
    std::vector<uint8_t> a(n), b(n);
    const float ma = vd.decode(l.data(), n, a.data());
    const float mb = vd.decode_generic(l.data(), n, b.data());
    BOOST_CHECK(a == b);
    BOOST_CHECK_CLOSE(ma, mb, 1e-3);
    BOOST_TEST_MESSAGE("viterbi kernel: " << viterbi_decoder::kernel());
}
