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

static const char* __doc_gr_scaleflu_coded_ofdm_demod =
    R"doc(Coded OFDM payload receiver: payload symbols in, CRC-checked PSDUs out, one report per frame.)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_demod_make =
    R"doc(make(max_psdu_len=1500, frame_len_key="frame_len", symbols_out=0))doc";
static const char* __doc_gr_scaleflu_coded_ofdm_demod_frames_ok = R"doc(PSDUs whose CRC32 matched.)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_demod_crc_errors =
    R"doc(Frames decoded with a CRC32 mismatch.)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_demod_bad_frames =
    R"doc(Frames dropped for inconsistent tags or cut off.)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_demod_frames_ok_per_mcs =
    R"doc(PSDUs whose CRC32 matched, per MCS index.)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_demod_last_snr_db =
    R"doc(SNR estimate of the last frame (dB).)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_demod_set_node_id =
    R"doc(Add "node" = node_id (the receiving node; -1: none) to every report dict.)doc";
