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

static const char* __doc_gr_scaleflu_header_guard =
    R"doc(Passes OFDM header_data messages; headers announcing packets longer than max_packet_len become PMT_F.)doc";
static const char* __doc_gr_scaleflu_header_guard_make =
    R"doc(make(max_packet_len, len_tag_key="packet_len"))doc";
static const char* __doc_gr_scaleflu_header_guard_rejected = R"doc(Headers replaced by PMT_F.)doc";
static const char* __doc_gr_scaleflu_header_guard_passed = R"doc(Headers passed on.)doc";
