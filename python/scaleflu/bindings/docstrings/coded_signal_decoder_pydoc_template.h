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

static const char* __doc_gr_scaleflu_coded_signal_decoder =
    R"doc(Decodes the coded OFDM SIGNAL field; posts the verdict (payload symbols, MCS, channel, noise, SNR) to the demux.)doc";
static const char* __doc_gr_scaleflu_coded_signal_decoder_make =
    R"doc(make(max_psdu_len=1500, frame_len_key="frame_len"))doc";
static const char* __doc_gr_scaleflu_coded_signal_decoder_set_demux =
    R"doc(Hand each verdict straight to an ofdm_burst_demux instead of posting it on header_data.)doc";
static const char* __doc_gr_scaleflu_coded_signal_decoder_headers = R"doc(SIGNAL fields examined.)doc";
static const char* __doc_gr_scaleflu_coded_signal_decoder_passed = R"doc(Valid SIGNAL fields.)doc";
static const char* __doc_gr_scaleflu_coded_signal_decoder_crc_failed =
    R"doc(SIGNAL fields whose CRC-16 (or tail) failed.)doc";
static const char* __doc_gr_scaleflu_coded_signal_decoder_version_mismatch =
    R"doc(SIGNAL fields of another MCS table version.)doc";
static const char* __doc_gr_scaleflu_coded_signal_decoder_unknown_mcs =
    R"doc(SIGNAL fields naming an MCS the table lacks.)doc";
static const char* __doc_gr_scaleflu_coded_signal_decoder_bad_length =
    R"doc(SIGNAL fields with length 0 or above max_psdu_len.)doc";
static const char* __doc_gr_scaleflu_coded_signal_decoder_no_channel =
    R"doc(Inputs without a channel estimate tag.)doc";
static const char* __doc_gr_scaleflu_coded_signal_decoder_set_node_id =
    R"doc(Add "node" = node_id (the receiving node; -1: none) to every report dict.)doc";
