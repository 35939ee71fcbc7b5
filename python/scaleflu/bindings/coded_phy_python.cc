/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace py = pybind11;

#include <gnuradio/scaleflu/coded_phy.h>
#include <stdexcept>
#include <string>

namespace {
namespace p = gr::scaleflu::phy;
using u8 = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;
using f32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
using c64 = py::array_t<std::complex<float>, py::array::c_style | py::array::forcecast>;

const p::mcs_info& mcs_or_raise(int mcs)
{
    const p::mcs_info* m = p::mcs_by_index(mcs);
    if (!m)
        throw std::invalid_argument("unknown mcs " + std::to_string(mcs));
    return *m;
}

template <typename T>
py::array_t<T> to_array(const std::vector<T>& v)
{
    py::array_t<T> a(v.size());
    std::copy(v.begin(), v.end(), a.mutable_data());
    return a;
}

std::string as_string(const py::bytes& b) { return std::string(b); }
} // namespace

// The coded PHY's bit-level functions (coded_phy.h), for tests against a Python reference,
// benchmarks, and the pure-Python MCS table's cross-check.
void bind_coded_phy(py::module& m)
{
    m.attr("PHY_MCS_TABLE_VERSION") = p::MCS_TABLE_VERSION;
    m.def(
        "phy_mcs_table",
        []() {
            py::list out;
            for (int i = 0; i < p::mcs_count(); i++) {
                const p::mcs_info& x = *p::mcs_by_index(i);
                py::dict d;
                d["index"] = x.index;
                d["name"] = x.name;
                d["bpsc"] = x.bpsc;
                d["rate"] = py::make_tuple(x.rate_num, x.rate_den);
                d["coded"] = x.coded();
                d["cbps"] = x.cbps();
                d["dbps"] = x.dbps();
                out.append(d);
            }
            return out;
        },
        "The MCS table (a list of dicts: index, name, bpsc, rate, coded, cbps, dbps).");
    m.def(
        "phy_payload_symbols",
        [](int mcs, size_t len) { return p::payload_symbols(mcs_or_raise(mcs), len); },
        py::arg("mcs"),
        py::arg("psdu_len"),
        "OFDM payload symbols of a PSDU of psdu_len bytes at this MCS.");
    m.def(
        "phy_crc16",
        [](const py::bytes& b) {
            const std::string s = as_string(b);
            return p::crc16(reinterpret_cast<const uint8_t*>(s.data()), s.size());
        },
        py::arg("data"),
        "CRC-16/CCITT-FALSE of the SIGNAL field.");
    m.def(
        "phy_scramble",
        [](u8 bits, int seed) {
            std::vector<uint8_t> v(bits.data(), bits.data() + bits.size());
            p::scramble(v.data(), v.size(), uint8_t(seed));
            return to_array(v);
        },
        py::arg("bits"),
        py::arg("seed"),
        "XOR the 802.11a scrambler sequence onto bits (0/1 values).");
    m.def(
        "phy_conv_encode",
        [](u8 bits) {
            std::vector<uint8_t> out(2 * size_t(bits.size()));
            p::conv_encode(bits.data(), size_t(bits.size()), out.data());
            return to_array(out);
        },
        py::arg("bits"),
        "Rate-1/2 K=7 (133, 171) encoder from state 0: A0 B0 A1 B1 ...");
    m.def(
        "phy_puncture",
        [](u8 coded, int num, int den) {
            const size_t n = size_t(coded.size()) / 2;
            std::vector<uint8_t> out(p::punctured_len(n, num, den));
            p::puncture(coded.data(), n, num, den, out.data());
            return to_array(out);
        },
        py::arg("coded"),
        py::arg("num"),
        py::arg("den"),
        "Puncture mother-code bits to num/den (802.11a patterns).");
    m.def(
        "phy_depuncture",
        [](f32 llr, size_t n_info, int num, int den) {
            if (size_t(llr.size()) != p::punctured_len(n_info, num, den))
                throw std::invalid_argument("llr has the wrong length for n_info at this rate");
            std::vector<float> out(2 * n_info);
            p::depuncture(llr.data(), n_info, num, den, out.data());
            return to_array(out);
        },
        py::arg("llr"),
        py::arg("n_info"),
        py::arg("num"),
        py::arg("den"),
        "Put punctured LLRs back in place (0 for stolen bits).");
    m.def(
        "phy_viterbi_decode",
        [](f32 llr) {
            if (llr.size() % 2)
                throw std::invalid_argument("llr must hold 2 values per information bit");
            const size_t n = size_t(llr.size()) / 2;
            std::vector<uint8_t> out(n);
            p::viterbi_decoder vd;
            {
                py::gil_scoped_release release;
                vd.decode(llr.data(), n, out.data());
            }
            return to_array(out);
        },
        py::arg("llr"),
        "Soft Viterbi decode (LLR > 0 means 1; trellis from and to state 0).");
    m.def(
        "phy_viterbi_bench",
        [](f32 llr, int reps) {
            const size_t n = size_t(llr.size()) / 2;
            std::vector<uint8_t> out(n);
            p::viterbi_decoder vd;
            py::gil_scoped_release release;
            for (int r = 0; r < reps; r++)
                vd.decode(llr.data(), n, out.data());
            return n * size_t(reps);
        },
        py::arg("llr"),
        py::arg("reps"),
        "Decode llr reps times (for timing); returns the bits decoded.");
    m.def("phy_viterbi_kernel", &p::viterbi_decoder::kernel, "The Viterbi kernel in use.");
    m.def(
        "phy_interleaver_map",
        [](int cbps, int bpsc) { return p::interleaver_map(cbps, bpsc); },
        py::arg("cbps"),
        py::arg("bpsc"),
        "802.11a interleaver: coded bit k goes to position map[k].");
    m.def(
        "phy_map_bits",
        [](u8 bits, int bpsc) {
            if (bits.size() % bpsc)
                throw std::invalid_argument("bits is not a whole number of symbols");
            const size_t n = size_t(bits.size()) / size_t(bpsc);
            std::vector<std::complex<float>> out(n);
            p::map_bits(bits.data(), bpsc, n, out.data());
            return to_array(out);
        },
        py::arg("bits"),
        py::arg("bpsc"),
        "Gray-mapped unit-power constellation points (802.11a).");
    m.def(
        "phy_demap_llr",
        [](c64 y, c64 h, float noise_var, int bpsc) {
            if (y.size() != h.size())
                throw std::invalid_argument("y and h must have the same length");
            std::vector<float> out(size_t(y.size()) * size_t(bpsc));
            p::demap_llr(y.data(), h.data(), noise_var, bpsc, size_t(y.size()), out.data());
            return to_array(out);
        },
        py::arg("y"),
        py::arg("h"),
        py::arg("noise_var"),
        py::arg("bpsc"),
        "Max-log LLRs (ln P(1)/P(0)) of received values y through channel h.");
    m.def(
        "phy_signal_bytes",
        [](int mcs, int length) {
            const auto b = p::signal_bytes(mcs, length);
            return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
        },
        py::arg("mcs"),
        py::arg("length"),
        "The 5 SIGNAL bytes (version/MCS, length, CRC-16).");
    m.def(
        "phy_signal_coded_bits",
        [](int mcs, int length) { return to_array(p::signal_coded_bits(mcs, length)); },
        py::arg("mcs"),
        py::arg("length"),
        "The 96 coded, interleaved SIGNAL bits.");
    m.def(
        "phy_parse_signal",
        [](const py::bytes& b, size_t max_length) -> py::object {
            const std::string s = as_string(b);
            if (s.size() != size_t(p::SIGNAL_BYTES))
                throw std::invalid_argument("a SIGNAL field has 5 bytes");
            p::signal_field f;
            const auto st =
                p::parse_signal(reinterpret_cast<const uint8_t*>(s.data()), max_length, f);
            if (st != p::signal_status::OK)
                return py::str(p::signal_status_name(st));
            return py::make_tuple(f.mcs, f.length);
        },
        py::arg("data"),
        py::arg("max_length"),
        "(mcs, length) of valid SIGNAL bytes, or the rejection reason.");
    m.def(
        "phy_decode_signal",
        [](f32 llr, size_t max_length) -> py::object {
            if (llr.size() != 2 * p::N_DATA)
                throw std::invalid_argument("the SIGNAL field has 96 LLRs");
            p::signal_field f;
            p::viterbi_decoder vd;
            const auto st = p::decode_signal(llr.data(), max_length, f, vd);
            if (st != p::signal_status::OK)
                return py::str(p::signal_status_name(st));
            return py::make_tuple(f.mcs, f.length);
        },
        py::arg("llr"),
        py::arg("max_length"),
        "(mcs, length) decoded from 96 SIGNAL LLRs, or the rejection reason.");
    m.def(
        "phy_encode_payload_bits",
        [](int mcs, const py::bytes& psdu) {
            const std::string s = as_string(psdu);
            return to_array(p::encode_payload_bits(mcs_or_raise(mcs),
                                                   reinterpret_cast<const uint8_t*>(s.data()),
                                                   s.size(),
                                                   p::SCRAMBLER_SEED));
        },
        py::arg("mcs"),
        py::arg("psdu"),
        "Coded bits of a PSDU in transmission order.");
    m.def(
        "phy_decode_payload_bits",
        [](int mcs, f32 llr, size_t len) {
            const p::mcs_info& mi = mcs_or_raise(mcs);
            const size_t want = size_t(p::payload_symbols(mi, len)) * size_t(mi.cbps());
            if (size_t(llr.size()) != want)
                throw std::invalid_argument("llr must hold " + std::to_string(want) + " values");
            std::vector<uint8_t> out;
            p::viterbi_decoder vd;
            const bool ok =
                p::decode_payload_bits(mi, llr.data(), len, p::SCRAMBLER_SEED, out, vd);
            return py::make_tuple(ok,
                                  py::bytes(reinterpret_cast<const char*>(out.data()), out.size()));
        },
        py::arg("mcs"),
        py::arg("llr"),
        py::arg("psdu_len"),
        "(crc_ok, bytes) decoded from a PSDU's LLRs in transmission order.");
}
