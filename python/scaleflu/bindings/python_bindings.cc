/*
 * Copyright 2020 Free Software Foundation, Inc.
 *
 * This file is part of GNU Radio
 *
 * SPDX-License-Identifier: GPL-3.0-or-later
 *
 */

#include <pybind11/pybind11.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

namespace py = pybind11;

// Headers for binding functions
/**************************************/
// The following comment block is used for
// gr_modtool to insert function prototypes
// Please do not delete
/**************************************/
// BINDING_FUNCTION_PROTOTYPES(
    void bind_frame_builder(py::module& m);
    void bind_frame_parser(py::module& m);
    void bind_frame_format(py::module& m);
    void bind_header_guard(py::module& m);
    void bind_header_parser_guard(py::module& m);
    void bind_ofdm_burst_demux(py::module& m);
    void bind_coded_phy(py::module& m);
    void bind_coded_ofdm_mod(py::module& m);
    void bind_coded_signal_decoder(py::module& m);
    void bind_coded_ofdm_demod(py::module& m);
    void bind_ofdm_preamble_sync(py::module& m);
// ) END BINDING_FUNCTION_PROTOTYPES


// We need this hack because import_array() returns NULL
// for newer Python versions.
// This function is also necessary because it ensures access to the C API
// and removes a warning.
void* init_numpy()
{
    import_array();
    return NULL;
}

PYBIND11_MODULE(scaleflu_python, m)
{
    // Initialize the numpy C API
    // (otherwise we will see segmentation faults)
    init_numpy();

    // Allow access to base block methods
    py::module::import("gnuradio.gr");

    /**************************************/
    // The following comment block is used for
    // gr_modtool to insert binding function calls
    // Please do not delete
    /**************************************/
    // BINDING_FUNCTION_CALLS(
    bind_frame_builder(m);
    bind_frame_parser(m);
    bind_frame_format(m);
    bind_header_guard(m);
    bind_ofdm_burst_demux(m);
    bind_header_parser_guard(m);
    bind_coded_phy(m);
    bind_coded_ofdm_mod(m);
    bind_coded_signal_decoder(m);
    bind_coded_ofdm_demod(m);
    bind_ofdm_preamble_sync(m);
    // ) END BINDING_FUNCTION_CALLS
}