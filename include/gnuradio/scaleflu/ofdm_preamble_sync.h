/* -*- c++ -*- */
/*
 * Copyright 2026 gr-scaleflu authors.
 * SPDX-License-Identifier: GPL-3.0-or-later
 */

#ifndef INCLUDED_SCALEFLU_OFDM_PREAMBLE_SYNC_H
#define INCLUDED_SCALEFLU_OFDM_PREAMBLE_SYNC_H

#include <gnuradio/scaleflu/api.h>
#include <gnuradio/sync_block.h>
#include <cstdint>
#include <vector>

namespace gr {
namespace scaleflu {

/*!
 * \brief OFDM frame detection and timing for low SNR: Schmidl & Cox detection, timing from a
 * cross-correlation with the known second sync symbol.
 * \ingroup scaleflu
 *
 * \details
 * A drop-in for digital.ofdm_sync_sc_cfb in front of a header/payload demux, with one
 * difference: its outputs refer to the input delayed by delay() samples, so the data path
 * to the demux must be delayed by delay() (not by one OFDM symbol).
 *
 * Output 0 (float): the fine frequency offset as ofdm_sync_sc_cfb gives it (the phase of the
 * Schmidl & Cox correlation, radians per half symbol; frequency_modulator_fc(-2 / fft_len)
 * turns it into the correction), held from one frame's trigger to the next. Output 1 (byte):
 * 1 where a frame's first sync symbol begins (its cyclic prefix, moved \p backoff samples
 * earlier into the prefix), else 0.
 *
 * Detection: the Schmidl & Cox metric |P|^2 / R^2 over half symbols above \p threshold (the
 * metric of a frame at SNR s is about (s / (1 + s))^2). Timing: the peak of the normalised
 * cross-correlation with the second sync symbol (after removing the offset), searched over
 * +-32 samples around where the metric's peak puts it; a peak below \p min_xcorr (noise, which
 * correlates at about 1 / fft_len) discards the detection. The stock detector's timing comes
 * from the middle of the metric's plateau, which spreads by several samples at low SNR and
 * costs whole frames (measured: docs/link.md, "Coded OFDM PHY").
 */
class SCALEFLU_API ofdm_preamble_sync : virtual public gr::sync_block
{
public:
    typedef std::shared_ptr<ofdm_preamble_sync> sptr;

    /*!
     * \param fft_len FFT length (even, >= 16)
     * \param cp_len cyclic prefix, 1 .. fft_len
     * \param sync_word1 the first sync symbol (fft_len values, gr-digital's shifted order;
     *        only even or only odd subcarriers)
     * \param sync_word2 the second sync symbol (fft_len values, same order)
     * \param threshold detection threshold of the Schmidl & Cox metric, (0, 1)
     * \param min_xcorr least normalised cross-correlation of a frame, (0, 1)
     * \param backoff samples the trigger is moved into the cyclic prefix, 0 .. cp_len
     */
    static sptr make(int fft_len,
                     int cp_len,
                     const std::vector<gr_complex>& sync_word1,
                     const std::vector<gr_complex>& sync_word2,
                     float threshold = 0.2f,
                     float min_xcorr = 0.3f,
                     int backoff = 4);

    //! Samples by which the outputs lag the input (delay the data path by this much).
    virtual int delay() const = 0;
    virtual uint64_t detections() const = 0; //!< frames signalled
    virtual uint64_t rejected() const = 0;   //!< metric crossings without a correlation peak
};

} // namespace scaleflu
} // namespace gr

#endif
