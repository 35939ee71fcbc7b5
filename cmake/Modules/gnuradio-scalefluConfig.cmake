find_package(PkgConfig)

PKG_CHECK_MODULES(PC_GR_SCALEFLU gnuradio-scaleflu)

FIND_PATH(
    GR_SCALEFLU_INCLUDE_DIRS
    NAMES gnuradio/scaleflu/api.h
    HINTS $ENV{SCALEFLU_DIR}/include
        ${PC_SCALEFLU_INCLUDEDIR}
    PATHS ${CMAKE_INSTALL_PREFIX}/include
          /usr/local/include
          /usr/include
)

FIND_LIBRARY(
    GR_SCALEFLU_LIBRARIES
    NAMES gnuradio-scaleflu
    HINTS $ENV{SCALEFLU_DIR}/lib
        ${PC_SCALEFLU_LIBDIR}
    PATHS ${CMAKE_INSTALL_PREFIX}/lib
          ${CMAKE_INSTALL_PREFIX}/lib64
          /usr/local/lib
          /usr/local/lib64
          /usr/lib
          /usr/lib64
          )

include("${CMAKE_CURRENT_LIST_DIR}/gnuradio-scalefluTarget.cmake")

INCLUDE(FindPackageHandleStandardArgs)
FIND_PACKAGE_HANDLE_STANDARD_ARGS(GR_SCALEFLU DEFAULT_MSG GR_SCALEFLU_LIBRARIES GR_SCALEFLU_INCLUDE_DIRS)
MARK_AS_ADVANCED(GR_SCALEFLU_LIBRARIES GR_SCALEFLU_INCLUDE_DIRS)
