/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_FRAME_PARSER_H
#define INCLUDED_SCALEFLU_FRAME_PARSER_H

#include <gnuradio/block.h>
#include <gnuradio/scaleflu/api.h>
#include <cstdint>

namespace gr {
namespace scaleflu {

/*!
 * \brief Raw frame PDUs in, CRC-checked and parsed frame PDUs out.
 * \ingroup scaleflu
 *
 * \details
 * Message port "in" takes PDUs whose bytes are one received frame (for example from
 * pdu.tagged_stream_to_pdu after digital.ofdm_rx). Frames that fail any check (size,
 * magic, version, length, CRC32, type, sequence) are dropped and counted; nothing
 * off the air can crash the block. Accepted frames leave on "out" as PDUs whose
 * metadata holds "type", "src", "dst", "msg_id", "seq", "count" and whose bytes are
 * the payload. With \p node_id >= 0 only frames addressed to that node or to the
 * broadcast address pass; -1 passes every frame. Frames longer than \p mtu bytes are
 * dropped and counted as malformed (as Python's FrameTooLongError).
 *
 * With set_raw_output(true) an accepted frame leaves with the same metadata plus
 * "raw" = #t and its bytes are the whole frame as received (header, payload, CRC;
 * the input vector is forwarded, not copied): scaleflu.link_arq then takes the
 * frame as it is instead of re-encoding it from the metadata in Python.
 */
class SCALEFLU_API frame_parser : virtual public gr::block
{
public:
    typedef std::shared_ptr<frame_parser> sptr;

    static sptr make(int node_id = -1, int mtu = 1500);

    virtual uint64_t frames_ok() const = 0;
    virtual uint64_t crc_errors() const = 0;
    virtual uint64_t malformed() const = 0;
    virtual uint64_t filtered() const = 0;
    //! Forward whole frames (metadata key "raw" = #t) instead of their payloads.
    virtual void set_raw_output(bool raw) = 0;
    virtual bool raw_output() const = 0;
};

} // namespace scaleflu
} // namespace gr

#endif /* INCLUDED_SCALEFLU_FRAME_PARSER_H */
