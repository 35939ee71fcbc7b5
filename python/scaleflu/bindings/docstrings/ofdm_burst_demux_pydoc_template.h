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

static const char* __doc_gr_scaleflu_ofdm_burst_demux =
    R"doc(OFDM header/payload demux that sleeps until its header's verdict arrives instead of polling.)doc";
static const char* __doc_gr_scaleflu_ofdm_burst_demux_make =
    R"doc(make(header_len, fft_len, cp_len, frame_len_key, max_payload_symbols))doc";
static const char* __doc_gr_scaleflu_ofdm_burst_demux_header_data =
    R"doc(The header's verdict (a dict of its tags, or #f); thread-safe.)doc";
static const char* __doc_gr_scaleflu_ofdm_burst_demux_headers =
    R"doc(Headers put out.)doc";
static const char* __doc_gr_scaleflu_ofdm_burst_demux_payloads =
    R"doc(Payloads put out.)doc";
static const char* __doc_gr_scaleflu_ofdm_burst_demux_failed =
    R"doc(Headers rejected.)doc";
