/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_CODED_OFDM_MOD_H
#define INCLUDED_SCALEFLU_CODED_OFDM_MOD_H

#include <gnuradio/scaleflu/api.h>
#include <gnuradio/tagged_stream_block.h>
#include <cstdint>
#include <string>
#include <vector>

namespace gr {
namespace scaleflu {

/*!
 * \brief Coded OFDM transmitter: PDU in, one complex burst per PDU out.
 * \ingroup scaleflu
 *
 * \details
 * Each PDU on message port "in" becomes one burst (coded_phy.h): the two Schmidl & Cox
 * sync symbols \p sync_word1, \p sync_word2 (64-point, gr-digital's shifted order, as
 * digital.ofdm_tx uses them), two SIGNAL symbols (MCS, length, CRC-16; BPSK rate 1/2) and
 * the payload symbols, each with a cyclic prefix of \p cp_len samples, followed by
 * \p post_padding zero samples; the whole is one tagged-stream packet (\p len_tag_key).
 * The burst has unit mean power (times the amplitude, set_amplitude()).
 *
 * The MCS of a PDU is its metadata "mcs" (an MCS index, or its name as a symbol/string,
 * e.g. "qpsk-3/4"); without it the MCS set for its destination (set_dst_mcs(); the frame's
 * dst field with \p framing, else metadata "dst"), else the block's MCS (set_mcs()). The
 * choice is made when the PDU is modulated, so an MCS set meanwhile applies to PDUs already
 * queued. A PDU with an unknown MCS is dropped, logged and counted.
 *
 * With \p framing the PDU is turned into a scaleflu link frame as the Frame Builder does
 * (header fields from the metadata, or metadata "raw" = #t for a whole frame); the PSDU is
 * that frame (at most \p mtu bytes). Without it the PDU's bytes are the PSDU (1..mtu).
 */
class SCALEFLU_API coded_ofdm_mod : virtual public gr::tagged_stream_block
{
public:
    typedef std::shared_ptr<coded_ofdm_mod> sptr;

    /*!
     * \param sync_word1 first sync symbol (64 values, gr-digital's _make_sync_word1)
     * \param sync_word2 second sync symbol (64 values, _make_sync_word2)
     * \param cp_len cyclic prefix in samples, 0..64
     * \param mcs default MCS index (coded_phy.h table)
     * \param mtu largest PSDU in bytes, 1..65535
     * \param post_padding zero samples after each burst
     * \param framing build scaleflu link frames from the PDUs (see above)
     * \param src default source node id (framing)
     * \param dst default destination node id (framing)
     * \param len_tag_key length tag key of the output packets
     */
    static sptr make(const std::vector<gr_complex>& sync_word1,
                     const std::vector<gr_complex>& sync_word2,
                     int cp_len = 16,
                     int mcs = 0,
                     int mtu = 1500,
                     int post_padding = 160,
                     bool framing = true,
                     int src = 0,
                     int dst = 65535,
                     const std::string& len_tag_key = "packet_len");

    //! Default MCS of PDUs without "mcs" metadata; throws std::invalid_argument if unknown.
    virtual void set_mcs(int mcs) = 0;
    virtual int mcs() const = 0;
    //! MCS of PDUs to \p dst without "mcs" metadata (\p mcs -1: back to the default).
    virtual void set_dst_mcs(int dst, int mcs) = 0;
    //! The MCS a PDU to \p dst without "mcs" metadata gets now.
    virtual int dst_mcs(int dst) const = 0;
    virtual void set_amplitude(float amplitude) = 0;
    virtual float amplitude() const = 0;
    virtual uint64_t frames_built() const = 0;   //!< bursts put out
    virtual uint64_t frames_dropped() const = 0; //!< PDUs dropped (bad PDU, unknown MCS)
    //! Bursts put out per MCS index (one entry per MCS of the table).
    virtual std::vector<uint64_t> frames_per_mcs() const = 0;
    //! Samples of the longest burst (the lowest MCS, mtu bytes), padding included.
    virtual int max_burst_len() const = 0;
};

} // namespace scaleflu
} // namespace gr

#endif /* INCLUDED_SCALEFLU_CODED_OFDM_MOD_H */
