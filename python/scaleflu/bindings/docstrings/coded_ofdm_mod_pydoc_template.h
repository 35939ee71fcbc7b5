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

static const char* __doc_gr_scaleflu_coded_ofdm_mod =
    R"doc(Coded OFDM transmitter: PDU in (metadata "mcs" per PDU), one burst per PDU out.)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_mod_make =
    R"doc(make(sync_word1, sync_word2, cp_len=16, mcs=0, mtu=1500, post_padding=160, framing=True, src=0, dst=65535, len_tag_key="packet_len"))doc";
static const char* __doc_gr_scaleflu_coded_ofdm_mod_set_mcs =
    R"doc(Default MCS index of PDUs without "mcs" metadata (ValueError if unknown).)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_mod_mcs = R"doc(Default MCS index.)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_mod_set_amplitude =
    R"doc(RMS amplitude of the bursts (1: unit mean power).)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_mod_amplitude = R"doc(RMS amplitude.)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_mod_frames_built = R"doc(Bursts put out.)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_mod_frames_dropped =
    R"doc(PDUs dropped (not a u8 PDU, bad frame fields, unknown MCS, too long).)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_mod_frames_per_mcs =
    R"doc(Bursts per MCS index.)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_mod_max_burst_len =
    R"doc(Samples of the longest burst (padding included).)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_mod_set_dst_mcs =
    R"doc(MCS of PDUs to dst without "mcs" metadata (mcs -1: back to the default); applies to PDUs already queued.)doc";
static const char* __doc_gr_scaleflu_coded_ofdm_mod_dst_mcs =
    R"doc(The MCS a PDU to dst without "mcs" metadata gets now.)doc";
