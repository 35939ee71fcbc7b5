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

static const char* __doc_gr_scaleflu_frame_parser =
    R"doc(Raw frame PDUs in, CRC-checked frame PDUs (header fields in metadata) out.)doc";
static const char* __doc_gr_scaleflu_frame_parser_make = R"doc(make(node_id=-1))doc";
static const char* __doc_gr_scaleflu_frame_parser_frames_ok = R"doc(Frames accepted.)doc";
static const char* __doc_gr_scaleflu_frame_parser_crc_errors = R"doc(Frames with a bad CRC32.)doc";
static const char* __doc_gr_scaleflu_frame_parser_malformed =
    R"doc(Frames rejected for size, magic, version, length, type or sequence.)doc";
static const char* __doc_gr_scaleflu_frame_parser_filtered =
    R"doc(Valid frames addressed to another node.)doc";
static const char* __doc_gr_scaleflu_frame_parser_set_raw_output =
    R"doc(Forward whole frames (metadata "raw" = #t) instead of their payloads.)doc";
static const char* __doc_gr_scaleflu_frame_parser_raw_output =
    R"doc(True when whole frames are forwarded.)doc";
