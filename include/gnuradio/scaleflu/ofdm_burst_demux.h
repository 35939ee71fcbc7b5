/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_OFDM_BURST_DEMUX_H
#define INCLUDED_SCALEFLU_OFDM_BURST_DEMUX_H

#include <gnuradio/block.h>
#include <gnuradio/scaleflu/api.h>
#include <cstdint>
#include <string>

namespace gr {
namespace scaleflu {

/*!
 * \brief Header/payload demultiplexer of the OFDM receiver that waits for its header
 * instead of polling.
 * \ingroup scaleflu
 *
 * \details
 * Does what digital.header_payload_demux(header_len, fft_len, cp_len, frame_len_key, "",
 * output_symbols=True) does in ofdm_link_rx: input 0 complex samples, input 1 the sync
 * detector's trigger bytes; at a trigger it puts out header_len symbols (the cyclic prefix
 * of each removed) on output 0, waits for the header's verdict, and on a valid header puts
 * out the payload's symbols (their number is the header's \p frame_len_key entry) on output
 * 1 with every entry of the header dict as a tag on the first payload symbol; a rejected
 * header (#f) makes it search for the next trigger one sample later.
 *
 * The verdict comes through header_data(): the header parser calls it from its own thread
 * (header_parser_guard::set_demux), and this block's thread sleeps on a condition variable
 * until it arrives. The stock demux returns from its work without output while it waits
 * for its "header_data" message, and GNU Radio's scheduler calls it again at once, so it
 * polls on one core for as long as the header takes to decode, competing for the CPU with
 * the blocks that decode it. The "header_data" message port is there too (for a parser
 * connected with msg_connect), but it is only served between calls of work.
 */
class SCALEFLU_API ofdm_burst_demux : virtual public gr::block
{
public:
    typedef std::shared_ptr<ofdm_burst_demux> sptr;

    /*!
     * \param header_len header symbols per frame (the sync symbols included), >= 1
     * \param fft_len samples per OFDM symbol without its prefix, >= 1
     * \param cp_len cyclic prefix samples, >= 0
     * \param frame_len_key header dict entry with the payload's length in symbols
     * \param max_payload_symbols longest payload accepted (longer headers count as failed)
     */
    static sptr make(int header_len,
                     int fft_len,
                     int cp_len,
                     const std::string& frame_len_key,
                     int max_payload_symbols);

    //! The header's verdict (a dict of its tags, or #f): thread-safe, wakes the block.
    virtual void header_data(pmt::pmt_t msg) = 0;

    virtual uint64_t headers() const = 0;  //!< headers put out
    virtual uint64_t payloads() const = 0; //!< payloads put out
    virtual uint64_t failed() const = 0;   //!< headers rejected (#f, bad or missing length)
};

} // namespace scaleflu
} // namespace gr

#endif /* INCLUDED_SCALEFLU_OFDM_BURST_DEMUX_H */
