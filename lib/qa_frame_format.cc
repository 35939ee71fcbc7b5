/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#include <gnuradio/scaleflu/frame_format.h>
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>

using namespace gr::scaleflu::frame;

namespace {
std::vector<uint8_t> bytes(const char* s) { return std::vector<uint8_t>(s, s + strlen(s)); }
} // namespace

BOOST_AUTO_TEST_CASE(crc32_matches_ieee_check_value)
{
    // The standard check value of CRC-32/ISO-HDLC (zlib.crc32(b"123456789")).
    const auto v = bytes("123456789");
    BOOST_CHECK_EQUAL(crc32(v.data(), v.size()), 0xCBF43926u);
    BOOST_CHECK_EQUAL(crc32(nullptr, 0), 0u);
}

BOOST_AUTO_TEST_CASE(build_parse_round_trip)
{
    header h;
    h.type = 0;
    h.src = 7;
    h.dst = 3;
    h.msg_id = 0xDEADBEEF;
    h.seq = 41;
    h.count = 42;
    std::vector<uint8_t> payload(DEFAULT_MTU - OVERHEAD);
    for (size_t i = 0; i < payload.size(); i++)
        payload[i] = uint8_t(i * 31 + 7);
    const auto f = build(h, payload.data(), payload.size());
    BOOST_CHECK_EQUAL(f.size(), DEFAULT_MTU);
    BOOST_CHECK_EQUAL(f[0], 0x53);
    BOOST_CHECK_EQUAL(f[1], 0x46);
    header g;
    const uint8_t* p = nullptr;
    size_t n = 0;
    BOOST_REQUIRE(parse(f.data(), f.size(), g, p, n) == parse_status::OK);
    BOOST_CHECK_EQUAL(g.src, 7);
    BOOST_CHECK_EQUAL(g.dst, 3);
    BOOST_CHECK_EQUAL(g.msg_id, 0xDEADBEEFu);
    BOOST_CHECK_EQUAL(g.seq, 41u);
    BOOST_CHECK_EQUAL(g.count, 42u);
    BOOST_REQUIRE_EQUAL(n, payload.size());
    BOOST_CHECK(std::equal(p, p + n, payload.begin()));
}

BOOST_AUTO_TEST_CASE(empty_payload_is_a_valid_frame)
{
    header h;
    const auto f = build(h, nullptr, 0);
    BOOST_CHECK_EQUAL(f.size(), OVERHEAD);
    header g;
    const uint8_t* p = nullptr;
    size_t n = 1;
    BOOST_CHECK(parse(f.data(), f.size(), g, p, n) == parse_status::OK);
    BOOST_CHECK_EQUAL(n, 0u);
}

BOOST_AUTO_TEST_CASE(build_rejects_bad_input)
{
    header h;
    std::vector<uint8_t> big(DEFAULT_MTU - OVERHEAD + 1);
    BOOST_CHECK_THROW(build(h, big.data(), big.size()), std::invalid_argument);
    h.count = 0;
    BOOST_CHECK_THROW(build(h, nullptr, 0), std::invalid_argument);
    h.count = 2;
    h.seq = 2;
    BOOST_CHECK_THROW(build(h, nullptr, 0), std::invalid_argument);
    h.seq = 0;
    h.type = 9;
    BOOST_CHECK_THROW(build(h, nullptr, 0), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(every_single_bit_flip_is_rejected)
{
    header h;
    h.msg_id = 5;
    const auto payload = bytes("weights of layer conv1, group 3");
    const auto f = build(h, payload.data(), payload.size());
    for (size_t bit = 0; bit < f.size() * 8; bit++) {
        auto g = f;
        g[bit / 8] ^= uint8_t(1u << (bit % 8));
        header out;
        const uint8_t* p = nullptr;
        size_t n = 0;
        BOOST_CHECK(parse(g.data(), g.size(), out, p, n) != parse_status::OK);
    }
}

BOOST_AUTO_TEST_CASE(specific_rejection_reasons)
{
    header h;
    const auto f = build(h, nullptr, 0);
    header out;
    const uint8_t* p = nullptr;
    size_t n = 0;
    BOOST_CHECK(parse(f.data(), 10, out, p, n) == parse_status::TOO_SHORT);
    auto g = f;
    g[0] = 0;
    BOOST_CHECK(parse(g.data(), g.size(), out, p, n) == parse_status::BAD_MAGIC);
    g = f;
    g[2] = 2;
    BOOST_CHECK(parse(g.data(), g.size(), out, p, n) == parse_status::BAD_VERSION);
    g = f;
    g.push_back(0);
    BOOST_CHECK(parse(g.data(), g.size(), out, p, n) == parse_status::LENGTH_MISMATCH);
    g = f;
    g.back() ^= 1;
    BOOST_CHECK(parse(g.data(), g.size(), out, p, n) == parse_status::CRC_MISMATCH);
}

BOOST_AUTO_TEST_CASE(random_bytes_never_parse_or_crash)
{
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int> byte(0, 255), len(0, 1600);
    size_t accepted = 0;
    for (int i = 0; i < 200000; i++) {
        std::vector<uint8_t> buf(len(rng));
        for (auto& b : buf)
            b = uint8_t(byte(rng));
        // Half the time give it a valid magic and version so deeper checks run.
        if (buf.size() >= 3 && (i & 1)) {
            buf[0] = 0x53;
            buf[1] = 0x46;
            buf[2] = 1;
        }
        header out;
        const uint8_t* p = nullptr;
        size_t n = 0;
        if (parse(buf.data(), buf.size(), out, p, n) == parse_status::OK)
            accepted++;
    }
    BOOST_CHECK_EQUAL(accepted, 0u);
}

BOOST_AUTO_TEST_CASE(parse_rejects_frames_longer_than_the_mtu)
{
    header h;
    std::vector<uint8_t> payload(200, 0x5A);
    const auto f = build(h, payload.data(), payload.size());
    const uint8_t* p = nullptr;
    size_t n = 0;
    header out;
    BOOST_CHECK(parse(f.data(), f.size(), out, p, n, f.size()) == parse_status::OK);
    BOOST_CHECK(parse(f.data(), f.size(), out, p, n, f.size() - 1) == parse_status::TOO_LONG);
    // checked before anything else, as Python's decode_frame (FrameTooLongError)
    std::vector<uint8_t> junk(DEFAULT_MTU + 1, 0);
    BOOST_CHECK(parse(junk.data(), junk.size(), out, p, n) == parse_status::TOO_LONG);
    BOOST_CHECK(std::string(status_name(parse_status::TOO_LONG)) == "longer than the mtu");
}
