/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */
#include "pydoc_macros.h"
#define D(...) DOC(gr, scaleflu, __VA_ARGS__)
/*
  This file contains placeholders for docstrings for the Python bindings.
  Do not edit! These were automatically extracted during the binding process
  and will be overwritten during the build process
 */

static const char* __doc_gr_scaleflu_header_parser_guard =
    R"doc(OFDM header parser (packet_header_ofdm) and header guard in one block.)doc";
static const char* __doc_gr_scaleflu_header_parser_guard_make =
    R"doc(make(occupied_carriers, n_syms, len_tag_key, frame_len_tag_key, num_tag_key, bits_per_header_sym, bits_per_payload_sym, scramble_header, max_packet_len))doc";
static const char* __doc_gr_scaleflu_header_parser_guard_rejected =
    R"doc(Headers announcing more than max_packet_len.)doc";
static const char* __doc_gr_scaleflu_header_parser_guard_passed =
    R"doc(Headers passed on.)doc";
static const char* __doc_gr_scaleflu_header_parser_guard_invalid =
    R"doc(Headers that failed their CRC.)doc";
static const char* __doc_gr_scaleflu_header_parser_guard_header_len =
    R"doc(Header bits consumed per header.)doc";
static const char* __doc_gr_scaleflu_header_parser_guard_set_demux =
    R"doc(Hand each verdict straight to an ofdm_burst_demux instead of posting it on header_data.)doc";
