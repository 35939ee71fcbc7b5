/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 *
 * References: IEEE Std 802.11-2020 clause 17 (the OFDM PHY of 802.11a): 17.3.5.4 scrambler,
 * 17.3.5.5 convolutional encoder, 17.3.5.6 puncturing, 17.3.5.7 interleaver, 17.3.5.8
 * subcarrier modulation mapping, 17.3.5.9 pilot polarity. Viterbi: A. J. Viterbi, "Error
 * bounds for convolutional codes and an asymptotically optimum decoding algorithm", IEEE
 * Trans. IT 13(2), 1967; the butterfly form of the add-compare-select follows from both
 * generators having their first and last taps set.
 */

#include <gnuradio/scaleflu/coded_phy.h>
#include <gnuradio/scaleflu/frame_format.h>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <stdexcept>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace gr {
namespace scaleflu {
namespace phy {

namespace {

const mcs_info MCS_TABLE[] = {
    // index, name, bits per subcarrier, rate
    { 0, "bpsk-1/2", 1, 1, 2 },  { 1, "bpsk-3/4", 1, 3, 4 },  { 2, "qpsk-1/2", 2, 1, 2 },
    { 3, "qpsk-3/4", 2, 3, 4 },  { 4, "16qam-1/2", 4, 1, 2 }, { 5, "16qam-3/4", 4, 3, 4 },
    { 6, "64qam-2/3", 6, 2, 3 }, { 7, "64qam-3/4", 6, 3, 4 }, { 8, "qpsk-uncoded", 2, 1, 1 },
};
constexpr int N_MCS = sizeof(MCS_TABLE) / sizeof(MCS_TABLE[0]);

constexpr uint8_t G0 = 0x5B; // 133 octal, bit 6 = current input
constexpr uint8_t G1 = 0x79; // 171 octal

inline int parity7(unsigned v) { return __builtin_parity(v & 0x7F); }

// 127-symbol pilot polarity (17.3.5.9): the scrambler sequence from the all-ones state,
// 0 -> +1, 1 -> -1.
std::array<float, 127> make_polarity()
{
    std::array<uint8_t, 127> bits{};
    scramble(bits.data(), bits.size(), 0x7F);
    std::array<float, 127> p{};
    for (size_t i = 0; i < p.size(); i++)
        p[i] = bits[i] ? -1.0f : 1.0f;
    return p;
}

// One axis of the Gray-mapped constellations of 17.3.5.8: level of the value whose bits
// (b0 first) form the integer v, in units where neighbours are 2 apart.
const float LEVELS1[2] = { -1, 1 };
const float LEVELS2[4] = { -3, -1, 3, 1 };                 // 00, 01, 10, 11
const float LEVELS3[8] = { -7, -5, -1, -3, 7, 5, 1, 3 };   // 000 .. 111

const float* axis_levels(int bits)
{
    switch (bits) {
    case 1:
        return LEVELS1;
    case 2:
        return LEVELS2;
    case 3:
        return LEVELS3;
    }
    throw std::invalid_argument("coded_phy: bits per axis must be 1, 2 or 3");
}

void check_rate(int num, int den)
{
    if (!((num == 1 && den == 2) || (num == 2 && den == 3) || (num == 3 && den == 4)))
        throw std::invalid_argument("coded_phy: code rate must be 1/2, 2/3 or 3/4");
}

// Puncturing pattern over one period of (A, B) pairs: which of the 2 * period mother bits
// are sent (802.11a figure 17-9).
struct pattern {
    int period;
    uint8_t keep[6];
};
pattern puncture_pattern(int num, int den)
{
    check_rate(num, den);
    if (num == 1)
        return { 1, { 1, 1 } };
    if (num == 2)
        return { 2, { 1, 1, 1, 0 } };
    return { 3, { 1, 1, 1, 0, 0, 1 } };
}

template <typename T>
void puncture_impl(const T* in, size_t n_info, int num, int den, T* out)
{
    const pattern p = puncture_pattern(num, den);
    if (n_info % size_t(p.period))
        throw std::invalid_argument("coded_phy: bits to puncture are not whole periods");
    size_t o = 0;
    for (size_t i = 0; i < 2 * n_info; i++)
        if (p.keep[i % size_t(2 * p.period)])
            out[o++] = in[i];
}

} // namespace

int mcs_count() { return N_MCS; }

const mcs_info* mcs_by_index(int index)
{
    for (const auto& m : MCS_TABLE)
        if (m.index == index)
            return &m;
    return nullptr;
}

const mcs_info* mcs_by_name(const std::string& name)
{
    std::string want(name);
    std::transform(want.begin(), want.end(), want.begin(), [](unsigned char c) {
        return char(std::tolower(c));
    });
    for (const auto& m : MCS_TABLE)
        if (want == m.name)
            return &m;
    return nullptr;
}

int payload_symbols(const mcs_info& m, size_t psdu_len)
{
    const size_t bits = 8 * (psdu_len + PHY_CRC_LEN) + (m.coded() ? TAIL_BITS : 0);
    const size_t dbps = size_t(m.dbps());
    return int((bits + dbps - 1) / dbps);
}

const std::array<int, N_DATA>& data_carriers()
{
    static const std::array<int, N_DATA> c = [] {
        std::array<int, N_DATA> a{};
        int n = 0;
        for (int k = -26; k <= 26; k++)
            if (k != 0 && k != -21 && k != -7 && k != 7 && k != 21)
                a[n++] = k + FFT_LEN / 2;
        return a;
    }();
    return c;
}

const std::array<int, N_PILOT>& pilot_subcarriers()
{
    static const std::array<int, N_PILOT> p = { -21, -7, 7, 21 };
    return p;
}

const std::array<int, N_PILOT>& pilot_carriers()
{
    static const std::array<int, N_PILOT> p = { -21 + 32, -7 + 32, 7 + 32, 21 + 32 };
    return p;
}

float pilot_value(int n, int p)
{
    static const std::array<float, 127> pol = make_polarity();
    static const float base[N_PILOT] = { 1, 1, 1, -1 };
    const int i = ((n % 127) + 127) % 127;
    return pol[size_t(i)] * base[p & 3];
}

// ----------------------------------------------------------------------------- bits, CRC
uint16_t crc16(const uint8_t* data, size_t len)
{
    uint16_t crc = 0xFFFF;
    for (size_t i = 0; i < len; i++) {
        crc ^= uint16_t(data[i]) << 8;
        for (int k = 0; k < 8; k++)
            crc = (crc & 0x8000) ? uint16_t((crc << 1) ^ 0x1021) : uint16_t(crc << 1);
    }
    return crc;
}

void bytes_to_bits(const uint8_t* bytes, size_t n_bytes, uint8_t* bits)
{
    for (size_t i = 0; i < n_bytes; i++)
        for (int k = 0; k < 8; k++)
            bits[8 * i + size_t(k)] = (bytes[i] >> k) & 1;
}

void bits_to_bytes(const uint8_t* bits, size_t n_bytes, uint8_t* bytes)
{
    for (size_t i = 0; i < n_bytes; i++) {
        uint8_t b = 0;
        for (int k = 0; k < 8; k++)
            b |= uint8_t((bits[8 * i + size_t(k)] & 1) << k);
        bytes[i] = b;
    }
}

void scramble(uint8_t* bits, size_t n, uint8_t seed)
{
    unsigned state = seed & 0x7F;
    if (state == 0)
        throw std::invalid_argument("coded_phy: the scrambler seed must not be 0");
    for (size_t i = 0; i < n; i++) {
        const unsigned fb = ((state >> 6) ^ (state >> 3)) & 1; // x^7 + x^4
        bits[i] ^= uint8_t(fb);
        state = ((state << 1) & 0x7E) | fb;
    }
}

// ---------------------------------------------------------------------- convolutional code
void conv_encode(const uint8_t* bits, size_t n, uint8_t* coded)
{
    unsigned s = 0; // b[n-1] .. b[n-6], b[n-1] in bit 5
    for (size_t i = 0; i < n; i++) {
        const unsigned w = (unsigned(bits[i] & 1) << 6) | s;
        coded[2 * i] = uint8_t(parity7(w & G0));
        coded[2 * i + 1] = uint8_t(parity7(w & G1));
        s = w >> 1;
    }
}

size_t punctured_len(size_t n_info, int num, int den)
{
    check_rate(num, den);
    return n_info * size_t(den) / size_t(num);
}

void puncture(const uint8_t* in, size_t n_info, int num, int den, uint8_t* out)
{
    puncture_impl(in, n_info, num, den, out);
}

void puncture(const float* in, size_t n_info, int num, int den, float* out)
{
    puncture_impl(in, n_info, num, den, out);
}

void depuncture(const float* in, size_t n_info, int num, int den, float* out)
{
    const pattern p = puncture_pattern(num, den);
    if (n_info % size_t(p.period))
        throw std::invalid_argument("coded_phy: bits to depuncture are not whole periods");
    size_t o = 0;
    for (size_t i = 0; i < 2 * n_info; i++)
        out[i] = p.keep[i % size_t(2 * p.period)] ? in[o++] : 0.0f;
}

namespace {

// Butterfly i (0..31): old states 2i, 2i+1 -> new states i (input 0), i + 32 (input 1).
// Outputs of 2i -> i are (a, b); 2i+1 -> i and 2i -> i+32 give their complements,
// 2i+1 -> i+32 gives (a, b) again. With the antipodal branch metric
// bm_i = (La * sa_i + Lb * sb_i) / 2, sa_i = +-1 for a = 1/0, a complement is -bm_i.
struct butterfly_signs {
    alignas(32) float sa[32];
    alignas(32) float sb[32];
    butterfly_signs()
    {
        for (unsigned i = 0; i < 32; i++) {
            const unsigned w = 2 * i; // input 0, old state 2i
            sa[i] = parity7(w & G0) ? 0.5f : -0.5f;
            sb[i] = parity7(w & G1) ? 0.5f : -0.5f;
        }
    }
};
const butterfly_signs SIGNS;
constexpr float NEG = -1e30f;

// Add-compare-select over the whole block; m: 64 metrics (state 0 at 0), dec: one 64-bit
// word per step (bit s: the survivor into state s came from the odd predecessor).
void acs_generic(const float* llr, size_t n, float* m, uint64_t* dec)
{
    float nxt[64];
    for (size_t t = 0; t < n; t++) {
        const float la = llr[2 * t], lb = llr[2 * t + 1];
        uint64_t d = 0;
        for (int i = 0; i < 32; i++) {
            const float bm = la * SIGNS.sa[i] + lb * SIGNS.sb[i];
            const float ev = m[2 * i], od = m[2 * i + 1];
            const float a0 = ev + bm, a1 = od - bm, b0 = ev - bm, b1 = od + bm;
            const bool da = a1 > a0, db = b1 > b0;
            nxt[i] = da ? a1 : a0;
            nxt[i + 32] = db ? b1 : b0;
            d |= (uint64_t(da) << i) | (uint64_t(db) << (i + 32));
        }
        dec[t] = d;
        std::copy(nxt, nxt + 64, m);
        if ((t & 31) == 31) {
            const float ref = *std::max_element(m, m + 64);
            for (int i = 0; i < 64; i++)
                m[i] -= ref;
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) void acs_avx2(const float* llr, size_t n, float* m, uint64_t* dec)
{
    __m256 v[8];
    for (int k = 0; k < 8; k++)
        v[k] = _mm256_loadu_ps(m + 8 * k);
    __m256 sa[4], sb[4];
    for (int k = 0; k < 4; k++) {
        sa[k] = _mm256_load_ps(SIGNS.sa + 8 * k);
        sb[k] = _mm256_load_ps(SIGNS.sb + 8 * k);
    }
    for (size_t t = 0; t < n; t++) {
        const __m256 la = _mm256_set1_ps(llr[2 * t]);
        const __m256 lb = _mm256_set1_ps(llr[2 * t + 1]);
        __m256 lo[4], hi[4];
        uint64_t d = 0;
        for (int k = 0; k < 4; k++) {
            // even / odd states of 16k .. 16k+15, in order
            const __m256 e = _mm256_castpd_ps(_mm256_permute4x64_pd(
                _mm256_castps_pd(_mm256_shuffle_ps(v[2 * k], v[2 * k + 1], 0x88)), 0xD8));
            const __m256 o = _mm256_castpd_ps(_mm256_permute4x64_pd(
                _mm256_castps_pd(_mm256_shuffle_ps(v[2 * k], v[2 * k + 1], 0xDD)), 0xD8));
            const __m256 bm = _mm256_add_ps(_mm256_mul_ps(la, sa[k]), _mm256_mul_ps(lb, sb[k]));
            const __m256 a0 = _mm256_add_ps(e, bm), a1 = _mm256_sub_ps(o, bm);
            const __m256 b0 = _mm256_sub_ps(e, bm), b1 = _mm256_add_ps(o, bm);
            const __m256 ca = _mm256_cmp_ps(a1, a0, _CMP_GT_OQ);
            const __m256 cb = _mm256_cmp_ps(b1, b0, _CMP_GT_OQ);
            lo[k] = _mm256_max_ps(a0, a1);
            hi[k] = _mm256_max_ps(b0, b1);
            d |= uint64_t(unsigned(_mm256_movemask_ps(ca))) << (8 * k);
            d |= uint64_t(unsigned(_mm256_movemask_ps(cb))) << (32 + 8 * k);
        }
        dec[t] = d;
        for (int k = 0; k < 4; k++) {
            v[k] = lo[k];
            v[4 + k] = hi[k];
        }
        if ((t & 31) == 31) {
            __m256 mx = v[0];
            for (int k = 1; k < 8; k++)
                mx = _mm256_max_ps(mx, v[k]);
            alignas(32) float tmp[8];
            _mm256_store_ps(tmp, mx);
            const __m256 ref = _mm256_set1_ps(*std::max_element(tmp, tmp + 8));
            for (int k = 0; k < 8; k++)
                v[k] = _mm256_sub_ps(v[k], ref);
        }
    }
    for (int k = 0; k < 8; k++)
        _mm256_storeu_ps(m + 8 * k, v[k]);
}

void acs_sse2(const float* llr, size_t n, float* m, uint64_t* dec)
{
    __m128 v[16];
    for (int k = 0; k < 16; k++)
        v[k] = _mm_loadu_ps(m + 4 * k);
    for (size_t t = 0; t < n; t++) {
        const __m128 la = _mm_set1_ps(llr[2 * t]);
        const __m128 lb = _mm_set1_ps(llr[2 * t + 1]);
        __m128 lo[8], hi[8];
        uint64_t d = 0;
        for (int k = 0; k < 8; k++) {
            const __m128 e = _mm_shuffle_ps(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0));
            const __m128 o = _mm_shuffle_ps(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1));
            const __m128 bm = _mm_add_ps(_mm_mul_ps(la, _mm_load_ps(SIGNS.sa + 4 * k)),
                                         _mm_mul_ps(lb, _mm_load_ps(SIGNS.sb + 4 * k)));
            const __m128 a0 = _mm_add_ps(e, bm), a1 = _mm_sub_ps(o, bm);
            const __m128 b0 = _mm_sub_ps(e, bm), b1 = _mm_add_ps(o, bm);
            lo[k] = _mm_max_ps(a0, a1);
            hi[k] = _mm_max_ps(b0, b1);
            d |= uint64_t(unsigned(_mm_movemask_ps(_mm_cmpgt_ps(a1, a0)))) << (4 * k);
            d |= uint64_t(unsigned(_mm_movemask_ps(_mm_cmpgt_ps(b1, b0)))) << (32 + 4 * k);
        }
        dec[t] = d;
        for (int k = 0; k < 8; k++) {
            v[k] = lo[k];
            v[8 + k] = hi[k];
        }
        if ((t & 31) == 31) {
            alignas(16) float tmp[64];
            for (int k = 0; k < 16; k++)
                _mm_store_ps(tmp + 4 * k, v[k]);
            const __m128 ref = _mm_set1_ps(*std::max_element(tmp, tmp + 64));
            for (int k = 0; k < 16; k++)
                v[k] = _mm_sub_ps(v[k], ref);
        }
    }
    for (int k = 0; k < 16; k++)
        _mm_storeu_ps(m + 4 * k, v[k]);
}

bool have_avx2()
{
    static const bool yes = __builtin_cpu_supports("avx2");
    return yes;
}
#endif

} // namespace

viterbi_decoder::viterbi_decoder() {}

const char* viterbi_decoder::kernel()
{
#if defined(__x86_64__) || defined(__i386__)
    return have_avx2() ? "avx2" : "sse2";
#else
    return "generic";
#endif
}

float viterbi_decoder::decode(const float* llr, size_t n, uint8_t* bits)
{
    if (n == 0)
        return 0.0f;
    if (d_decisions.size() < n)
        d_decisions.resize(n);
    float m[64];
    std::fill(m, m + 64, NEG);
    m[0] = 0.0f;
#if defined(__x86_64__) || defined(__i386__)
    if (have_avx2())
        acs_avx2(llr, n, m, d_decisions.data());
    else
        acs_sse2(llr, n, m, d_decisions.data());
#else
    acs_generic(llr, n, m, d_decisions.data());
#endif
    unsigned s = 0; // the tail bits end the encoder in state 0
    for (size_t t = n; t-- > 0;) {
        bits[t] = uint8_t(s >> 5);
        const unsigned j = unsigned(d_decisions[t] >> s) & 1u;
        s = ((s & 31) << 1) | j;
    }
    return m[0];
}

float viterbi_decoder::decode_generic(const float* llr, size_t n, uint8_t* bits)
{
    if (n == 0)
        return 0.0f;
    if (d_decisions.size() < n)
        d_decisions.resize(n);
    float m[64];
    std::fill(m, m + 64, NEG);
    m[0] = 0.0f;
    acs_generic(llr, n, m, d_decisions.data());
    unsigned s = 0;
    for (size_t t = n; t-- > 0;) {
        bits[t] = uint8_t(s >> 5);
        s = ((s & 31) << 1) | (unsigned(d_decisions[t] >> s) & 1u);
    }
    return m[0];
}

// ------------------------------------------------------------------------ interleaver
std::vector<int> interleaver_map(int cbps, int bpsc)
{
    if (cbps <= 0 || cbps % 16 || bpsc <= 0)
        throw std::invalid_argument("coded_phy: interleaver needs cbps a multiple of 16");
    const int s = std::max(bpsc / 2, 1);
    std::vector<int> map(size_t(cbps), 0);
    for (int k = 0; k < cbps; k++) {
        const int i = (cbps / 16) * (k % 16) + k / 16;
        const int j = s * (i / s) + (i + cbps - (16 * i / cbps)) % s;
        map[size_t(k)] = j;
    }
    return map;
}

// ------------------------------------------------------------------------ constellation
float constellation_scale(int bpsc)
{
    switch (bpsc) {
    case 1:
        return 1.0f;
    case 2:
        return float(1.0 / std::sqrt(2.0));
    case 4:
        return float(1.0 / std::sqrt(10.0));
    case 6:
        return float(1.0 / std::sqrt(42.0));
    }
    throw std::invalid_argument("coded_phy: bits per subcarrier must be 1, 2, 4 or 6");
}

void map_bits(const uint8_t* bits, int bpsc, size_t n, gr_complex* out)
{
    const float k = constellation_scale(bpsc);
    if (bpsc == 1) {
        for (size_t i = 0; i < n; i++)
            out[i] = gr_complex(bits[i] ? 1.0f : -1.0f, 0.0f);
        return;
    }
    const int half = bpsc / 2;
    const float* lv = axis_levels(half);
    for (size_t i = 0; i < n; i++) {
        const uint8_t* b = bits + i * size_t(bpsc);
        unsigned vi = 0, vq = 0;
        for (int q = 0; q < half; q++) {
            vi = (vi << 1) | (b[q] & 1u);
            vq = (vq << 1) | (b[half + q] & 1u);
        }
        out[i] = gr_complex(lv[vi] * k, lv[vq] * k);
    }
}

namespace {
// Max-log bit metrics of one axis value x (level units): d0^2 - d1^2 per bit.
inline void axis_llr(float x, int bits, const float* lv, float scale, float* out)
{
    const int m = 1 << bits;
    float d0[3] = { 1e30f, 1e30f, 1e30f }, d1[3] = { 1e30f, 1e30f, 1e30f };
    for (int v = 0; v < m; v++) {
        const float e = x - lv[v];
        const float d = e * e;
        for (int q = 0; q < bits; q++) {
            if ((v >> (bits - 1 - q)) & 1)
                d1[q] = std::min(d1[q], d);
            else
                d0[q] = std::min(d0[q], d);
        }
    }
    for (int q = 0; q < bits; q++)
        out[q] = scale * (d0[q] - d1[q]);
}
} // namespace

void demap_llr(const gr_complex* y,
               const gr_complex* h,
               float noise_var,
               int bpsc,
               size_t n,
               float* llr)
{
    const float k = constellation_scale(bpsc);
    const float nv = noise_var > 0 ? noise_var : 1e-20f;
    if (bpsc == 1) {
        for (size_t i = 0; i < n; i++) // (x+1)^2 - (x-1)^2 = 4x, x = Re(y h*) / |h|^2
            llr[i] = 4.0f * (y[i] * std::conj(h[i])).real() / nv;
        return;
    }
    const int half = bpsc / 2;
    const float* lv = axis_levels(half);
    for (size_t i = 0; i < n; i++) {
        const float g = std::norm(h[i]);
        float* out = llr + i * size_t(bpsc);
        if (!(g > 0.0f)) {
            std::fill(out, out + bpsc, 0.0f);
            continue;
        }
        const gr_complex z = y[i] * std::conj(h[i]) / (g * k); // level units
        const float scale = g * k * k / nv;
        axis_llr(z.real(), half, lv, scale, out);
        axis_llr(z.imag(), half, lv, scale, out + half);
    }
}

// -------------------------------------------------------------------- channel estimate
namespace {
// occupied subcarriers (shifted index) in increasing frequency
std::array<int, N_OCCUPIED> occupied_carriers()
{
    std::array<int, N_OCCUPIED> a{};
    int n = 0;
    for (int k = -26; k <= 26; k++)
        if (k != 0)
            a[size_t(n++)] = k + FFT_LEN / 2;
    return a;
}
} // namespace

channel_smoother::channel_smoother(int taps) : d_taps(taps)
{
    if (taps < 1 || taps > 32)
        throw std::invalid_argument("channel_smoother: taps must be in [1, 32]");
    const auto occ = occupied_carriers();
    const int n = N_OCCUPIED, l = taps;
    // A (n x l): A[k][t] = exp(-2 pi j sc_k d_t / 64), delays d_t centred on 0
    std::vector<std::complex<double>> a(size_t(n * l));
    for (int k = 0; k < n; k++)
        for (int t = 0; t < l; t++) {
            const double d = t - (l - 1) / 2.0;
            const double sc = occ[size_t(k)] - FFT_LEN / 2;
            a[size_t(k * l + t)] = std::polar(1.0, -2.0 * M_PI * sc * d / FFT_LEN);
        }
    // G = A^H A (l x l), inverted by Gauss-Jordan (well conditioned: about n * I)
    std::vector<std::complex<double>> g(size_t(l * l)), inv(size_t(l * l));
    for (int i = 0; i < l; i++)
        for (int j = 0; j < l; j++) {
            std::complex<double> acc = 0;
            for (int k = 0; k < n; k++)
                acc += std::conj(a[size_t(k * l + i)]) * a[size_t(k * l + j)];
            g[size_t(i * l + j)] = acc;
            inv[size_t(i * l + j)] = i == j ? 1.0 : 0.0;
        }
    for (int c = 0; c < l; c++) {
        int piv = c;
        for (int r = c + 1; r < l; r++)
            if (std::abs(g[size_t(r * l + c)]) > std::abs(g[size_t(piv * l + c)]))
                piv = r;
        for (int j = 0; j < l; j++) {
            std::swap(g[size_t(c * l + j)], g[size_t(piv * l + j)]);
            std::swap(inv[size_t(c * l + j)], inv[size_t(piv * l + j)]);
        }
        const std::complex<double> d = g[size_t(c * l + c)];
        for (int j = 0; j < l; j++) {
            g[size_t(c * l + j)] /= d;
            inv[size_t(c * l + j)] /= d;
        }
        for (int r = 0; r < l; r++) {
            if (r == c)
                continue;
            const std::complex<double> f = g[size_t(r * l + c)];
            for (int j = 0; j < l; j++) {
                g[size_t(r * l + j)] -= f * g[size_t(c * l + j)];
                inv[size_t(r * l + j)] -= f * inv[size_t(c * l + j)];
            }
        }
    }
    // P = A G^-1 A^H (n x n)
    std::vector<std::complex<double>> b(size_t(n * l)); // A G^-1
    for (int k = 0; k < n; k++)
        for (int j = 0; j < l; j++) {
            std::complex<double> acc = 0;
            for (int t = 0; t < l; t++)
                acc += a[size_t(k * l + t)] * inv[size_t(t * l + j)];
            b[size_t(k * l + j)] = acc;
        }
    d_proj.resize(size_t(n * n));
    for (int r = 0; r < n; r++)
        for (int c = 0; c < n; c++) {
            std::complex<double> acc = 0;
            for (int t = 0; t < l; t++)
                acc += b[size_t(r * l + t)] * std::conj(a[size_t(c * l + t)]);
            d_proj[size_t(r * n + c)] = gr_complex(acc);
        }
}

float channel_smoother::smooth(gr_complex* h) const
{
    static const auto occ = occupied_carriers();
    // mean phase step between adjacent subcarriers
    gr_complex s(0, 0);
    for (int k = 0; k + 1 < N_OCCUPIED; k++)
        if (occ[size_t(k + 1)] == occ[size_t(k)] + 1)
            s += h[occ[size_t(k + 1)]] * std::conj(h[occ[size_t(k)]]);
    const float step = std::abs(s) > 0 ? std::arg(s) : 0.0f;
    gr_complex g[N_OCCUPIED], rot[N_OCCUPIED];
    for (int k = 0; k < N_OCCUPIED; k++) {
        rot[k] = std::polar(1.0f, step * float(occ[size_t(k)] - FFT_LEN / 2));
        g[k] = h[occ[size_t(k)]] * std::conj(rot[k]);
    }
    double resid = 0;
    for (int r = 0; r < N_OCCUPIED; r++) {
        gr_complex acc(0, 0);
        const gr_complex* p = &d_proj[size_t(r * N_OCCUPIED)];
        for (int c = 0; c < N_OCCUPIED; c++)
            acc += p[c] * g[c];
        resid += std::norm(acc - g[r]);
        h[occ[size_t(r)]] = acc * rot[r];
    }
    return float(resid / N_OCCUPIED);
}

// ----------------------------------------------------------------------------- SIGNAL
const char* signal_status_name(signal_status s)
{
    switch (s) {
    case signal_status::OK:
        return "ok";
    case signal_status::CRC:
        return "signal crc mismatch";
    case signal_status::VERSION:
        return "other mcs table version";
    case signal_status::UNKNOWN_MCS:
        return "unknown mcs";
    case signal_status::BAD_LENGTH:
        return "bad length";
    }
    return "unknown";
}

std::array<uint8_t, SIGNAL_BYTES> signal_bytes(int mcs, int length)
{
    if (!mcs_by_index(mcs))
        throw std::invalid_argument("coded_phy: unknown mcs " + std::to_string(mcs));
    if (length < 1 || size_t(length) > MAX_PSDU_LEN)
        throw std::invalid_argument("coded_phy: PSDU length must be in [1, 65535]");
    std::array<uint8_t, SIGNAL_BYTES> b{};
    b[0] = uint8_t((MCS_TABLE_VERSION << 5) | (mcs & 0x1F));
    b[1] = uint8_t(length >> 8);
    b[2] = uint8_t(length);
    const uint16_t c = crc16(b.data(), 3);
    b[3] = uint8_t(c >> 8);
    b[4] = uint8_t(c);
    return b;
}

signal_status parse_signal(const uint8_t* b, size_t max_length, signal_field& out)
{
    const uint16_t c = crc16(b, 3);
    if (b[3] != uint8_t(c >> 8) || b[4] != uint8_t(c))
        return signal_status::CRC;
    if ((b[0] >> 5) != MCS_TABLE_VERSION)
        return signal_status::VERSION;
    const int mcs = b[0] & 0x1F;
    if (!mcs_by_index(mcs))
        return signal_status::UNKNOWN_MCS;
    const int length = (int(b[1]) << 8) | b[2];
    if (length < 1 || size_t(length) > max_length)
        return signal_status::BAD_LENGTH;
    out.mcs = mcs;
    out.length = length;
    return signal_status::OK;
}

std::vector<uint8_t> signal_coded_bits(int mcs, int length)
{
    const auto b = signal_bytes(mcs, length);
    uint8_t bits[N_DATA] = {}; // 40 data bits, 6 tail, 2 pad
    bytes_to_bits(b.data(), SIGNAL_BYTES, bits);
    uint8_t coded[2 * N_DATA];
    conv_encode(bits, N_DATA, coded);
    static const std::vector<int> map = interleaver_map(N_DATA, 1);
    std::vector<uint8_t> out(2 * N_DATA);
    for (int s = 0; s < SIGNAL_SYMBOLS; s++)
        for (int k = 0; k < N_DATA; k++)
            out[size_t(s * N_DATA + map[size_t(k)])] = coded[s * N_DATA + k];
    return out;
}

signal_status decode_signal(const float* llr96,
                            size_t max_length,
                            signal_field& out,
                            viterbi_decoder& vd,
                            uint8_t* bytes)
{
    static const std::vector<int> map = interleaver_map(N_DATA, 1);
    float llr[2 * N_DATA];
    for (int s = 0; s < SIGNAL_SYMBOLS; s++)
        for (int k = 0; k < N_DATA; k++)
            llr[s * N_DATA + k] = llr96[s * N_DATA + map[size_t(k)]];
    uint8_t bits[N_DATA];
    vd.decode(llr, N_DATA, bits);
    uint8_t b[SIGNAL_BYTES];
    bits_to_bytes(bits, SIGNAL_BYTES, b);
    if (bytes)
        std::copy(b, b + SIGNAL_BYTES, bytes);
    for (int i = 8 * SIGNAL_BYTES; i < N_DATA; i++)
        if (bits[i]) // tail and pad are zero in every valid SIGNAL field
            return signal_status::CRC;
    return parse_signal(b, max_length, out);
}

// ---------------------------------------------------------------------------- payload
std::vector<uint8_t>
encode_payload_bits(const mcs_info& m, const uint8_t* psdu, size_t len, uint8_t seed)
{
    if (len < 1 || len > MAX_PSDU_LEN)
        throw std::invalid_argument("coded_phy: PSDU length must be in [1, 65535]");
    const int n_sym = payload_symbols(m, len);
    const size_t n_info = size_t(n_sym) * size_t(m.dbps());
    std::vector<uint8_t> bytes(psdu, psdu + len);
    const uint32_t crc = frame::crc32(psdu, len);
    for (int s = 24; s >= 0; s -= 8)
        bytes.push_back(uint8_t(crc >> s));
    std::vector<uint8_t> bits(n_info, 0); // tail and pad: zeros, not scrambled
    bytes_to_bits(bytes.data(), bytes.size(), bits.data());
    scramble(bits.data(), 8 * bytes.size(), seed);
    if (!m.coded())
        return bits;
    std::vector<uint8_t> mother(2 * n_info);
    conv_encode(bits.data(), n_info, mother.data());
    std::vector<uint8_t> coded(punctured_len(n_info, m.rate_num, m.rate_den));
    puncture(mother.data(), n_info, m.rate_num, m.rate_den, coded.data());
    const std::vector<int> map = interleaver_map(m.cbps(), m.bpsc);
    const size_t cbps = size_t(m.cbps());
    std::vector<uint8_t> out(coded.size());
    for (size_t s = 0; s < size_t(n_sym); s++)
        for (size_t k = 0; k < cbps; k++)
            out[s * cbps + size_t(map[k])] = coded[s * cbps + k];
    return out;
}

bool decode_payload_bits(const mcs_info& m,
                         const float* llr,
                         size_t len,
                         uint8_t seed,
                         std::vector<uint8_t>& out,
                         viterbi_decoder& vd)
{
    const int n_sym = payload_symbols(m, len);
    const size_t n_info = size_t(n_sym) * size_t(m.dbps());
    const size_t n_bytes = len + PHY_CRC_LEN;
    std::vector<uint8_t> bits(n_info);
    if (!m.coded()) {
        for (size_t i = 0; i < 8 * n_bytes; i++)
            bits[i] = llr[i] > 0.0f;
    } else {
        const std::vector<int> map = interleaver_map(m.cbps(), m.bpsc);
        const size_t cbps = size_t(m.cbps());
        std::vector<float> deint(size_t(n_sym) * cbps);
        for (size_t s = 0; s < size_t(n_sym); s++)
            for (size_t k = 0; k < cbps; k++)
                deint[s * cbps + k] = llr[s * cbps + size_t(map[k])];
        std::vector<float> mother(2 * n_info);
        depuncture(deint.data(), n_info, m.rate_num, m.rate_den, mother.data());
        vd.decode(mother.data(), n_info, bits.data());
    }
    scramble(bits.data(), 8 * n_bytes, seed);
    std::vector<uint8_t> bytes(n_bytes);
    bits_to_bytes(bits.data(), n_bytes, bytes.data());
    uint32_t got = 0;
    for (size_t i = len; i < n_bytes; i++)
        got = (got << 8) | bytes[i];
    out.assign(bytes.begin(), bytes.begin() + long(len));
    return got == frame::crc32(bytes.data(), len);
}

} // namespace phy
} // namespace scaleflu
} // namespace gr
