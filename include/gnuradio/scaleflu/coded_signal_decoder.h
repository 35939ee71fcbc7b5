/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_CODED_SIGNAL_DECODER_H
#define INCLUDED_SCALEFLU_CODED_SIGNAL_DECODER_H

#include <gnuradio/scaleflu/api.h>
#include <gnuradio/scaleflu/ofdm_burst_demux.h>
#include <gnuradio/sync_block.h>
#include <cstdint>
#include <string>

namespace gr {
namespace scaleflu {

/*!
 * \brief Decodes the coded OFDM frame's SIGNAL field and tells the header/payload demux
 * how many payload symbols follow.
 * \ingroup scaleflu
 *
 * \details
 * Input: the two SIGNAL symbols of each frame as 64-point FFT vectors from
 * digital.ofdm_chanest_vcvc (n_data_symbols = 2), whose tags "ofdm_sync_chan_taps" (the
 * channel from the second sync symbol) and "ofdm_sync_carr_offset" sit on the first. The
 * block removes each symbol's common phase with its pilots, computes BPSK LLRs weighted
 * by |H|^2, Viterbi-decodes the 48 SIGNAL bits and checks them (coded_phy.h: CRC-16, MCS
 * table version, known MCS, 1 <= length <= max_psdu_len).
 *
 * A valid SIGNAL gives the verdict dict: \p frame_len_key = payload symbols, "mcs",
 * "psdu_len", "ofdm_sync_carr_offset", "chan_est" (the channel averaged over the second
 * sync symbol and both SIGNAL symbols, now known), "noise_var" (per subcarrier, from the
 * spread of those three estimates) and "snr_db" (the frame's SNR over the whole 64-bin
 * band: mean |H|^2 / noise_var * 52 / 64, i.e. the per-sample SNR of the burst). Any other
 * gives #f, is counted, and a dict {"header_ok": #f, "reason": ...} goes out on "report".
 * Verdicts go to the demux set with set_demux() (called from this block's thread), else
 * out on "header_data" (for digital.header_payload_demux).
 */
class SCALEFLU_API coded_signal_decoder : virtual public gr::sync_block
{
public:
    typedef std::shared_ptr<coded_signal_decoder> sptr;

    /*!
     * \param max_psdu_len longest PSDU accepted (bytes), 1..65535
     * \param frame_len_key verdict entry with the payload's length in OFDM symbols
     */
    static sptr make(int max_psdu_len = 1500, const std::string& frame_len_key = "frame_len");

    virtual void set_demux(ofdm_burst_demux::sptr demux) = 0;
    //! Add "node" = \p node_id (the receiving node; -1: none) to every report dict.
    virtual void set_node_id(int node_id) = 0;
    virtual uint64_t headers() const = 0;          //!< SIGNAL fields examined
    virtual uint64_t passed() const = 0;           //!< valid ones
    virtual uint64_t crc_failed() const = 0;       //!< CRC-16 (or tail) mismatch
    virtual uint64_t version_mismatch() const = 0; //!< another MCS table version
    virtual uint64_t unknown_mcs() const = 0;      //!< an MCS index the table lacks
    virtual uint64_t bad_length() const = 0;       //!< length 0 or > max_psdu_len
    virtual uint64_t no_channel() const = 0;       //!< no channel estimate tag (not a frame)
};

} // namespace scaleflu
} // namespace gr

#endif
