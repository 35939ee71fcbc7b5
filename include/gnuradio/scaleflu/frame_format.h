/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 *
 * The scaleflu link frame (version 1). Same bytes as scaleflu.link.frame (Python);
 * docs/link.md is the reference. All fields big-endian:
 *
 *   off size field
 *   0   2    magic 0x5346 ("SF")
 *   2   1    version = 1
 *   3   1    type: 0 DATA, 1 ACK, 2 NACK
 *   4   2    src node id
 *   6   2    dst node id (0xFFFF broadcast)
 *   8   4    msg_id
 *   12  4    seq   (fragment index, seq < count)
 *   16  4    count (fragments in the message, >= 1)
 *   20  2    length (payload bytes)
 *   22  len  payload
 *   22+len 4 crc32 (IEEE / zlib) over bytes [0, 22+len)
 */

#ifndef INCLUDED_SCALEFLU_FRAME_FORMAT_H
#define INCLUDED_SCALEFLU_FRAME_FORMAT_H

#include <gnuradio/scaleflu/api.h>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gr {
namespace scaleflu {
namespace frame {

constexpr uint16_t MAGIC = 0x5346;
constexpr uint8_t VERSION = 1;
constexpr size_t HEADER_LEN = 22;
constexpr size_t CRC_LEN = 4;
constexpr size_t OVERHEAD = HEADER_LEN + CRC_LEN;
constexpr size_t DEFAULT_MTU = 1500;
constexpr uint16_t BROADCAST = 0xFFFF;

enum class frame_type : uint8_t { DATA = 0, ACK = 1, NACK = 2 };

struct SCALEFLU_API header {
    uint8_t type = 0;
    uint16_t src = 0;
    uint16_t dst = BROADCAST;
    uint32_t msg_id = 0;
    uint32_t seq = 0;
    uint32_t count = 1;
};

/*! Why a frame was rejected (OK when it was accepted). */
enum class parse_status : int {
    OK = 0,
    TOO_SHORT,
    BAD_MAGIC,
    BAD_VERSION,
    BAD_TYPE,
    LENGTH_MISMATCH,
    BAD_SEQUENCE,
    CRC_MISMATCH,
    TOO_LONG, //!< longer than the MTU (checked first, as Python's FrameTooLongError)
};

SCALEFLU_API const char* status_name(parse_status s);

/*! IEEE 802.3 CRC32 (the same value as Python's zlib.crc32). */
SCALEFLU_API uint32_t crc32(const uint8_t* data, size_t len, uint32_t crc = 0);

/*! Build a frame; throws std::invalid_argument if the payload exceeds mtu - OVERHEAD
 *  or the header is inconsistent (count == 0, seq >= count, unknown type). */
SCALEFLU_API std::vector<uint8_t>
build(const header& h, const uint8_t* payload, size_t len, size_t mtu = DEFAULT_MTU);

/*! Validate and parse a frame. On OK, fills h and sets payload/payload_len to the
 *  payload inside buf (no copy). Never reads outside [buf, buf+len). Checks in the
 *  order of scaleflu.link.frame.decode_frame: TOO_LONG (len > mtu), TOO_SHORT /
 *  BAD_MAGIC, BAD_VERSION, LENGTH_MISMATCH, CRC_MISMATCH, BAD_TYPE, BAD_SEQUENCE. */
SCALEFLU_API parse_status parse(const uint8_t* buf,
                                size_t len,
                                header& h,
                                const uint8_t*& payload,
                                size_t& payload_len,
                                size_t mtu = DEFAULT_MTU);

} // namespace frame
} // namespace scaleflu
} // namespace gr

#endif /* INCLUDED_SCALEFLU_FRAME_FORMAT_H */
