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

static const char* __doc_gr_scaleflu_ofdm_preamble_sync =
    R"doc(OFDM frame detection (Schmidl & Cox) and timing (cross-correlation with the second sync symbol) for low SNR; outputs lag the input by delay() samples.)doc";
static const char* __doc_gr_scaleflu_ofdm_preamble_sync_make =
    R"doc(make(fft_len, cp_len, sync_word1, sync_word2, threshold=0.2, min_xcorr=0.3, backoff=4))doc";
static const char* __doc_gr_scaleflu_ofdm_preamble_sync_delay =
    R"doc(Samples by which the outputs lag the input (delay the data path by this much).)doc";
static const char* __doc_gr_scaleflu_ofdm_preamble_sync_detections = R"doc(Frames signalled.)doc";
static const char* __doc_gr_scaleflu_ofdm_preamble_sync_rejected =
    R"doc(Metric crossings without a correlation peak (noise).)doc";
