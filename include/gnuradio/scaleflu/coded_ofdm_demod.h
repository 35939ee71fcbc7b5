/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_CODED_OFDM_DEMOD_H
#define INCLUDED_SCALEFLU_CODED_OFDM_DEMOD_H

#include <gnuradio/scaleflu/api.h>
#include <gnuradio/sync_block.h>
#include <cstdint>
#include <string>
#include <vector>

namespace gr {
namespace scaleflu {

/*!
 * \brief Coded OFDM payload receiver: payload symbols in, checked PSDUs out.
 * \ingroup scaleflu
 *
 * \details
 * Input: 64-point FFT vectors of the payload symbols, the first of each frame tagged with
 * the entries of coded_signal_decoder's verdict (\p frame_len_key, "mcs", "psdu_len",
 * "chan_est", "noise_var", "snr_db", "ofdm_sync_carr_offset"), as the header/payload demux
 * puts them. Once a frame's symbols are in: phase tracking from the pilots (a residual
 * carrier offset and a sample-clock slope fitted over the frame, the remaining common
 * phase smoothed over 9 symbols), max-log LLRs scaled by |H|^2 / noise_var per subcarrier,
 * deinterleaving, depuncturing, Viterbi decoding (coded_phy.h), descrambling, CRC32.
 *
 * "out": PDUs whose CRC32 matched, metadata "mcs", "snr_db", "psdu_len", "crc_ok" = #t.
 * "report": one dict per frame, {"header_ok": #t, "crc_ok": bool, "mcs", "snr_db",
 * "psdu_len", "n_sym"}. "symbols": per frame a PDU of up to \p symbols_out equalised data
 * subcarrier values (unit-power constellation; 0: none), for a constellation display.
 * Tags that announce an impossible frame are dropped and counted.
 */
class SCALEFLU_API coded_ofdm_demod : virtual public gr::sync_block
{
public:
    typedef std::shared_ptr<coded_ofdm_demod> sptr;

    /*!
     * \param max_psdu_len longest PSDU accepted (bytes), 1..65535
     * \param frame_len_key tag with the frame's payload length in OFDM symbols
     * \param symbols_out equalised values per frame on "symbols" (0: none)
     */
    static sptr make(int max_psdu_len = 1500,
                     const std::string& frame_len_key = "frame_len",
                     int symbols_out = 0);

    //! Add "node" = \p node_id (the receiving node; -1: none) to every report dict.
    virtual void set_node_id(int node_id) = 0;
    virtual uint64_t frames_ok() const = 0;    //!< PSDUs whose CRC32 matched
    virtual uint64_t crc_errors() const = 0;   //!< frames decoded with a CRC32 mismatch
    virtual uint64_t bad_frames() const = 0;   //!< inconsistent tags or cut-off frames
    virtual std::vector<uint64_t> frames_ok_per_mcs() const = 0;
    virtual double last_snr_db() const = 0;    //!< SNR estimate of the last frame
};

} // namespace scaleflu
} // namespace gr

#endif
