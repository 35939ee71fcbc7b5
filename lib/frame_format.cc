/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#include <gnuradio/scaleflu/frame_format.h>
#include <array>
#include <stdexcept>

namespace gr {
namespace scaleflu {
namespace frame {

namespace {

std::array<uint32_t, 256> make_table()
{
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        t[i] = c;
    }
    return t;
}

const std::array<uint32_t, 256>& table()
{
    static const std::array<uint32_t, 256> t = make_table();
    return t;
}

inline void put16(uint8_t* p, uint16_t v)
{
    p[0] = uint8_t(v >> 8);
    p[1] = uint8_t(v);
}
inline void put32(uint8_t* p, uint32_t v)
{
    p[0] = uint8_t(v >> 24);
    p[1] = uint8_t(v >> 16);
    p[2] = uint8_t(v >> 8);
    p[3] = uint8_t(v);
}
inline uint16_t get16(const uint8_t* p) { return uint16_t((p[0] << 8) | p[1]); }
inline uint32_t get32(const uint8_t* p)
{
    return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) |
           uint32_t(p[3]);
}

} // namespace

const char* status_name(parse_status s)
{
    switch (s) {
    case parse_status::OK:
        return "ok";
    case parse_status::TOO_SHORT:
        return "too short";
    case parse_status::BAD_MAGIC:
        return "bad magic";
    case parse_status::BAD_VERSION:
        return "unsupported version";
    case parse_status::BAD_TYPE:
        return "unknown frame type";
    case parse_status::LENGTH_MISMATCH:
        return "length mismatch";
    case parse_status::BAD_SEQUENCE:
        return "bad sequence (count == 0 or seq >= count)";
    case parse_status::CRC_MISMATCH:
        return "crc mismatch";
    case parse_status::TOO_LONG:
        return "longer than the mtu";
    }
    return "unknown";
}

uint32_t crc32(const uint8_t* data, size_t len, uint32_t crc)
{
    const auto& t = table();
    crc = ~crc;
    for (size_t i = 0; i < len; i++)
        crc = t[(crc ^ data[i]) & 0xFFu] ^ (crc >> 8);
    return ~crc;
}

std::vector<uint8_t> build(const header& h, const uint8_t* payload, size_t len, size_t mtu)
{
    if (mtu < OVERHEAD + 1 || mtu > 65535 + OVERHEAD)
        throw std::invalid_argument("scaleflu frame: mtu must be in [27, 65561]");
    if (len > mtu - OVERHEAD)
        throw std::invalid_argument("scaleflu frame: payload of " + std::to_string(len) +
                                    " B exceeds mtu " + std::to_string(mtu) + " - " +
                                    std::to_string(OVERHEAD) + " B of header and CRC");
    if (h.count == 0 || h.seq >= h.count)
        throw std::invalid_argument("scaleflu frame: need count >= 1 and seq < count");
    if (h.type > uint8_t(frame_type::NACK))
        throw std::invalid_argument("scaleflu frame: unknown frame type " +
                                    std::to_string(h.type));
    std::vector<uint8_t> out(HEADER_LEN + len + CRC_LEN);
    uint8_t* p = out.data();
    put16(p, MAGIC);
    p[2] = VERSION;
    p[3] = h.type;
    put16(p + 4, h.src);
    put16(p + 6, h.dst);
    put32(p + 8, h.msg_id);
    put32(p + 12, h.seq);
    put32(p + 16, h.count);
    put16(p + 20, uint16_t(len));
    if (len)
        std::copy(payload, payload + len, p + HEADER_LEN);
    put32(p + HEADER_LEN + len, crc32(p, HEADER_LEN + len));
    return out;
}

parse_status parse(const uint8_t* buf,
                   size_t len,
                   header& h,
                   const uint8_t*& payload,
                   size_t& payload_len,
                   size_t mtu)
{
    if (len > mtu)
        return parse_status::TOO_LONG;
    if (buf == nullptr || len < OVERHEAD)
        return parse_status::TOO_SHORT;
    if (get16(buf) != MAGIC)
        return parse_status::BAD_MAGIC;
    if (buf[2] != VERSION)
        return parse_status::BAD_VERSION;
    const size_t plen = get16(buf + 20);
    if (HEADER_LEN + plen + CRC_LEN != len)
        return parse_status::LENGTH_MISMATCH;
    if (crc32(buf, HEADER_LEN + plen) != get32(buf + HEADER_LEN + plen))
        return parse_status::CRC_MISMATCH;
    if (buf[3] > uint8_t(frame_type::NACK))
        return parse_status::BAD_TYPE;
    h.type = buf[3];
    h.src = get16(buf + 4);
    h.dst = get16(buf + 6);
    h.msg_id = get32(buf + 8);
    h.seq = get32(buf + 12);
    h.count = get32(buf + 16);
    if (h.count == 0 || h.seq >= h.count)
        return parse_status::BAD_SEQUENCE;
    payload = buf + HEADER_LEN;
    payload_len = plen;
    return parse_status::OK;
}

} // namespace frame
} // namespace scaleflu
} // namespace gr
