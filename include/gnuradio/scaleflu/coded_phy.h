/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 *
 * The coded OFDM PHY of gr-scaleflu: modulation and coding schemes (MCS), the frame's
 * SIGNAL header, and the bit-level pieces both ends share. The payload chain follows
 * IEEE 802.11a-1999 clause 17 (IEEE Std 802.11-2020 clause 17), with the differences listed
 * in docs/link.md ("Coded OFDM PHY"):
 *
 *   PSDU bytes + CRC32 -> bits (each byte LSB first) -> scrambler x^7 + x^4 + 1 (17.3.5.4)
 *   -> 6 zero tail bits + zero pad to whole OFDM symbols -> convolutional code K = 7,
 *   g0 = 133, g1 = 171 (octal) (17.3.5.5) -> puncturing to 2/3 or 3/4 (17.3.5.6)
 *   -> per-OFDM-symbol block interleaver (17.3.5.7) -> Gray-mapped BPSK / QPSK / 16-QAM /
 *   64-QAM (17.3.5.8, table 17-6..17-10) on the 48 data subcarriers; 4 pilots at -21, -7, 7,
 *   21 with the 127-symbol polarity sequence (17.3.5.9).
 *
 * Frame on air: 2 Schmidl & Cox sync symbols (gr-digital's sync words), 2 SIGNAL symbols
 * (BPSK, rate 1/2), then the payload symbols. The SIGNAL field carries 40 bits:
 *
 *   byte 0  bits 7..5: MCS table version (MCS_TABLE_VERSION), bits 4..0: MCS index
 *   byte 1-2          PSDU length in bytes (big-endian, >= 1)
 *   byte 3-4          CRC-16/CCITT-FALSE over bytes 0..2 (big-endian)
 *
 * sent LSB first per byte, followed by 6 zero tail bits and 2 zero pad bits: 48 bits, coded
 * at rate 1/2 into 96 bits, interleaved in two blocks of 48 (one per SIGNAL symbol).
 *
 * Log-likelihood ratios throughout are L = ln P(bit = 1) / P(bit = 0): positive means 1.
 */

#ifndef INCLUDED_SCALEFLU_CODED_PHY_H
#define INCLUDED_SCALEFLU_CODED_PHY_H

#include <gnuradio/gr_complex.h>
#include <gnuradio/scaleflu/api.h>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gr {
namespace scaleflu {
namespace phy {

//! Version of the MCS table below; both ends check it (SIGNAL field, registration).
constexpr int MCS_TABLE_VERSION = 1;
constexpr int FFT_LEN = 64;       //!< the coded PHY uses 802.11a's 64-point layout
constexpr int N_DATA = 48;        //!< data subcarriers per OFDM symbol
constexpr int N_PILOT = 4;        //!< pilot subcarriers per OFDM symbol
constexpr int N_OCCUPIED = 52;    //!< data + pilot subcarriers
constexpr int SIGNAL_SYMBOLS = 2; //!< BPSK rate-1/2 OFDM symbols of the SIGNAL field
constexpr int SIGNAL_BYTES = 5;   //!< MCS byte, length (2), CRC-16 (2)
constexpr int TAIL_BITS = 6;
constexpr int PHY_CRC_LEN = 4; //!< CRC32 appended to every PSDU
constexpr uint8_t SCRAMBLER_SEED = 0x5D;
constexpr size_t MAX_PSDU_LEN = 65535;

/*! One entry of the MCS table. */
struct SCALEFLU_API mcs_info {
    int index;
    const char* name; //!< e.g. "qpsk-3/4", "qpsk-uncoded"
    int bpsc;         //!< coded bits per subcarrier: 1, 2, 4, 6
    int rate_num;     //!< code rate numerator (rate 1/1: no code, no interleaver)
    int rate_den;     //!< code rate denominator
    bool coded() const { return rate_den != rate_num; }
    int cbps() const { return N_DATA * bpsc; }                    //!< coded bits per symbol
    int dbps() const { return cbps() * rate_num / rate_den; }     //!< data bits per symbol
};

SCALEFLU_API int mcs_count();
//! The entry with this index, or nullptr when the table has none.
SCALEFLU_API const mcs_info* mcs_by_index(int index);
//! The entry with this name (case-insensitive), or nullptr.
SCALEFLU_API const mcs_info* mcs_by_name(const std::string& name);
//! OFDM payload symbols that carry a PSDU of \p psdu_len bytes (CRC32, tail and pad added).
SCALEFLU_API int payload_symbols(const mcs_info& m, size_t psdu_len);

/*! Subcarrier layout (indices into a 64-point FFT vector in gr-digital's shifted order,
 *  i.e. subcarrier c at index c + 32): data subcarriers in increasing frequency, then
 *  pilots at -21, -7, 7, 21. */
SCALEFLU_API const std::array<int, N_DATA>& data_carriers();
SCALEFLU_API const std::array<int, N_PILOT>& pilot_carriers();
//! Subcarrier number (-26..26) of each pilot.
SCALEFLU_API const std::array<int, N_PILOT>& pilot_subcarriers();
//! Pilot value on pilot \p p of OFDM symbol \p n (n = 0, 1: SIGNAL; 2.. the payload).
SCALEFLU_API float pilot_value(int n, int p);

// ---------------------------------------------------------------------------- bits, CRC
//! CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF): "123456789" -> 0x29B1.
SCALEFLU_API uint16_t crc16(const uint8_t* data, size_t len);
//! Bytes to bits, each byte LSB first (one bit per output byte).
SCALEFLU_API void bytes_to_bits(const uint8_t* bytes, size_t n_bytes, uint8_t* bits);
SCALEFLU_API void bits_to_bytes(const uint8_t* bits, size_t n_bytes, uint8_t* bytes);
/*! XOR the 802.11a scrambler sequence (x^7 + x^4 + 1, 7-bit state \p seed != 0) onto
 *  \p n bits in place. With seed 0x7F the sequence starts 0000 1110 1111 0010 ... */
SCALEFLU_API void scramble(uint8_t* bits, size_t n, uint8_t seed);

// ---------------------------------------------------------------------- convolutional code
/*! Rate-1/2 K = 7 encoder (g0 = 133, g1 = 171 octal), starting in state 0: \p n bits in,
 *  2n coded bits out as A0 B0 A1 B1 ... */
SCALEFLU_API void conv_encode(const uint8_t* bits, size_t n, uint8_t* coded);
//! Coded bits kept by puncturing 2n mother-code bits to num/den (1/2, 2/3, 3/4).
SCALEFLU_API size_t punctured_len(size_t n_info, int num, int den);
/*! Puncture \p n_info * 2 mother-code bits (or LLRs) to rate num/den: 802.11a's patterns
 *  (2/3: A0 B0 A1; 3/4: A0 B0 A1 B2). Throws std::invalid_argument for another rate or an
 *  n_info that is not a whole number of puncturing periods. */
SCALEFLU_API void puncture(const uint8_t* in, size_t n_info, int num, int den, uint8_t* out);
SCALEFLU_API void puncture(const float* in, size_t n_info, int num, int den, float* out);
//! Put the punctured LLRs back in place, with 0 (no information) for the stolen bits.
SCALEFLU_API void depuncture(const float* in, size_t n_info, int num, int den, float* out);

/*!
 * \brief Soft-decision Viterbi decoder of the K = 7 (133, 171) code, 64 states.
 *
 * Max-log (correlation) metric on the LLRs; the encoder starts in state 0 and ends in
 * state 0 (tail bits), so the trellis is traced back from state 0. Keeps its buffers
 * between calls: one decoder per thread.
 */
class SCALEFLU_API viterbi_decoder
{
public:
    viterbi_decoder();
    /*! Decode \p n_info bits from 2 * n_info LLRs (A0 B0 A1 B1 ..., 0 for erased bits).
     *  Returns the path metric of the decoded sequence (larger: more reliable). */
    float decode(const float* llr, size_t n_info, uint8_t* bits);
    //! The same with the portable scalar kernel (tests compare the two).
    float decode_generic(const float* llr, size_t n_info, uint8_t* bits);
    //! The kernel decode() uses on this CPU: "avx2", "sse2" or "generic".
    static const char* kernel();

private:
    std::vector<uint64_t> d_decisions; // one bit per state and step
};

// ------------------------------------------------------------------------ interleaver
/*! 802.11a block interleaver for one OFDM symbol of \p cbps coded bits at \p bpsc bits per
 *  subcarrier: coded bit k is sent at position map[k]. */
SCALEFLU_API std::vector<int> interleaver_map(int cbps, int bpsc);

// ------------------------------------------------------------------------ constellation
//! 802.11a normalisation factor of the constellation (1, 1/sqrt(2), 1/sqrt(10), 1/sqrt(42)).
SCALEFLU_API float constellation_scale(int bpsc);
//! Map \p n * bpsc bits (b0 first) to \p n Gray-mapped unit-power symbols (802.11a 17.3.5.8).
SCALEFLU_API void map_bits(const uint8_t* bits, int bpsc, size_t n, gr_complex* out);
/*!
 * Max-log LLRs of the \p bpsc bits of each of \p n received subcarrier values \p y, given
 * the channel \p h (same scale as y) and the complex noise variance \p noise_var of y:
 * L = (|h|^2 / noise_var) * (d0^2 - d1^2), d0 (d1) the distance of y / h to the nearest
 * point whose bit is 0 (1). \p bpsc LLRs per value into \p llr.
 */
SCALEFLU_API void demap_llr(const gr_complex* y,
                            const gr_complex* h,
                            float noise_var,
                            int bpsc,
                            size_t n,
                            float* llr);

// -------------------------------------------------------------------- channel estimate
/*!
 * \brief Denoises a channel estimate over the 52 occupied subcarriers.
 *
 * The estimate's mean phase slope across subcarriers (the timing offset) is removed, the
 * result is projected (least squares) onto channel impulse responses of \p taps samples
 * centred on that delay, and the slope is put back: an unbiased estimate for any channel
 * whose delay spread fits in \p taps samples, with \p taps / 52 of the noise.
 */
class SCALEFLU_API channel_smoother
{
public:
    explicit channel_smoother(int taps = 9);
    /*! Smooth \p h (64 values, shifted order; only occupied subcarriers are read and
     *  written) in place. Returns the mean |h - smoothed h|^2 over the occupied ones. */
    float smooth(gr_complex* h) const;
    int taps() const { return d_taps; }

private:
    int d_taps;
    std::vector<gr_complex> d_proj; // 52 x 52 projection, row-major
};

// ----------------------------------------------------------------------------- SIGNAL
enum class signal_status : int {
    OK = 0,
    CRC,         //!< the SIGNAL field's CRC-16 failed
    VERSION,     //!< another MCS table version
    UNKNOWN_MCS, //!< an MCS index this table does not have
    BAD_LENGTH,  //!< length 0 or longer than the receiver's maximum
};
SCALEFLU_API const char* signal_status_name(signal_status s);

struct SCALEFLU_API signal_field {
    int mcs = 0;
    int length = 0; //!< PSDU bytes
};

//! The 5 SIGNAL bytes (version/MCS, length, CRC-16); throws for an unknown MCS or length.
SCALEFLU_API std::array<uint8_t, SIGNAL_BYTES> signal_bytes(int mcs, int length);
//! Check the 5 SIGNAL bytes: CRC, table version, MCS, 1 <= length <= max_length.
SCALEFLU_API signal_status parse_signal(const uint8_t* bytes,
                                        size_t max_length,
                                        signal_field& out);
//! The 96 coded, interleaved SIGNAL bits (48 per SIGNAL symbol, in subcarrier order).
SCALEFLU_API std::vector<uint8_t> signal_coded_bits(int mcs, int length);
/*! Decode the SIGNAL field from its 96 LLRs (subcarrier order, 48 per symbol) and check
 *  it; \p bytes (optional) receives the 5 decoded bytes whatever the status. */
SCALEFLU_API signal_status decode_signal(const float* llr96,
                                         size_t max_length,
                                         signal_field& out,
                                         viterbi_decoder& vd,
                                         uint8_t* bytes = nullptr);

// ---------------------------------------------------------------------------- payload
/*! The coded bits of a PSDU in transmission order: payload_symbols(m, len) * m.cbps()
 *  bits (CRC32 appended, scrambled with \p seed, tail, pad, coded, punctured, interleaved). */
SCALEFLU_API std::vector<uint8_t>
encode_payload_bits(const mcs_info& m, const uint8_t* psdu, size_t len, uint8_t seed);
/*! Decode a PSDU of \p len bytes from payload_symbols(m, len) * m.cbps() LLRs in
 *  transmission order; true when its CRC32 matches (\p out holds the bytes either way). */
SCALEFLU_API bool decode_payload_bits(const mcs_info& m,
                                      const float* llr,
                                      size_t len,
                                      uint8_t seed,
                                      std::vector<uint8_t>& out,
                                      viterbi_decoder& vd);

} // namespace phy
} // namespace scaleflu
} // namespace gr

#endif /* INCLUDED_SCALEFLU_CODED_PHY_H */
