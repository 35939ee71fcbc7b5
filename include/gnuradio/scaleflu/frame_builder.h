/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_FRAME_BUILDER_H
#define INCLUDED_SCALEFLU_FRAME_BUILDER_H

#include <gnuradio/scaleflu/api.h>
#include <gnuradio/tagged_stream_block.h>
#include <cstdint>

namespace gr {
namespace scaleflu {

/*!
 * \brief PDU in, tagged-stream link frames out (header with 32-bit sequence, CRC32).
 * \ingroup scaleflu
 *
 * \details
 * Each PDU on message port "in" becomes one frame (see frame_format.h) written to the
 * byte output as one tagged-stream packet (length tag \p len_tag_key), ready for
 * digital.ofdm_tx. Header fields come from the PDU metadata keys "type", "src", "dst",
 * "msg_id", "seq", "count"; missing keys default to DATA, \p src, \p dst, an internal
 * message counter, 0 and 1 (so a bare PDU becomes a one-fragment message). PDUs whose
 * payload exceeds mtu - 26 bytes, or whose metadata is inconsistent, are dropped with
 * an error in the log and counted.
 *
 * A PDU whose metadata has "raw" = #t already holds a whole encoded frame (as
 * scaleflu.link_arq emits it): it is checked (size against \p mtu, magic, version,
 * length, CRC32, type, sequence) and written unchanged; one that fails is dropped and
 * counted. This keeps the per-frame header work of the Python ARQ out of Python.
 */
class SCALEFLU_API frame_builder : virtual public gr::tagged_stream_block
{
public:
    typedef std::shared_ptr<frame_builder> sptr;

    /*!
     * \param mtu largest frame in bytes (header + payload + CRC), 27..65561
     * \param src default source node id
     * \param dst default destination node id (65535 = broadcast)
     * \param len_tag_key length tag key of the output packets
     */
    static sptr make(int mtu = 1500,
                     int src = 0,
                     int dst = 65535,
                     const std::string& len_tag_key = "packet_len");

    virtual uint64_t frames_built() const = 0;
    virtual uint64_t frames_dropped() const = 0;
    virtual int mtu() const = 0;
};

} // namespace scaleflu
} // namespace gr

#endif /* INCLUDED_SCALEFLU_FRAME_BUILDER_H */
