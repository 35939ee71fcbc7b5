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

static const char* __doc_gr_scaleflu_frame_builder =
    R"doc(PDU in, tagged-stream link frames out (22-byte header with 32-bit sequence, CRC32).)doc";
static const char* __doc_gr_scaleflu_frame_builder_make =
    R"doc(make(mtu=1500, src=0, dst=65535, len_tag_key='packet_len'))doc";
static const char* __doc_gr_scaleflu_frame_builder_frames_built = R"doc(Frames written.)doc";
static const char* __doc_gr_scaleflu_frame_builder_frames_dropped =
    R"doc(PDUs dropped (not a u8 PDU, bad metadata, payload over mtu - 26).)doc";
static const char* __doc_gr_scaleflu_frame_builder_mtu = R"doc(Largest frame in bytes.)doc";
