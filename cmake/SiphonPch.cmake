# Precompiled headers (SIPHON_PCH, on by default): every C++ target of ours
# reuses one of two precompiled headers, built once per tree:
#   siphon_pch       cmake/pch/common.h, for the product's code;
#   siphon_pch_test  common.h + cmake/pch/test.h, for the test code, which
#                    compiles with SIPHON_TEST_OPT (tests/CMakeLists.txt).
# Parsing Boost.Asio, Abseil and our generated protobuf headers was about
# half of every file's compile time, and the builds are most of CI's time.
#
# A target reuses a precompiled header only when it compiles with the same
# flags (GCC then silently parses the headers again, which -Winvalid-pch
# and -Werror turn into an error; clang refuses), so a target with other
# flags sets the SIPHON_NO_PCH property. The fuzz targets (their own
# sanitizer flags) and the generated protobuf library (which the precompiled
# headers depend on) get none; neither do the generated containerd client
# and the example programs (docs/examples), which prove that the public
# client headers do not include protobuf.
option(SIPHON_PCH "Precompiled headers for the common heavy headers" ON)

set(SIPHON_PCH_DIR ${CMAKE_CURRENT_LIST_DIR}/pch)

# -include utility (Boost 1.74 + GCC 12, top-level CMakeLists.txt) where no
# precompiled header (which starts with <utility>) is used.
set(siphon_include_utility "$<$<COMPILE_LANGUAGE:CXX>:SHELL:-include utility>")

# A macro the headers look at must be defined alike in the header and its
# users (GCC: "not used because X is defined"): some of our targets get
# BOOST_ALL_NO_LIB (Boost::headers) and NOMINMAX (gRPC), both for Windows,
# from their dependencies, and -pthread defines _REENTRANT; so the
# precompiled headers and every target that reuses them get all three.
set(siphon_pch_definitions BOOST_ALL_NO_LIB NOMINMAX)

# siphon_pch_target(NAME HEADERS... ): an object library whose only job is
# to build the precompiled header that other targets reuse; it is defined in
# the directory whose compile options the reusing targets share.
function(siphon_pch_target name)
  add_library(${name} OBJECT ${SIPHON_PCH_DIR}/empty.cc)
  siphon_warnings(${name})
  target_link_libraries(${name} PRIVATE siphon_proto absl::status absl::statusor Boost::headers)
  target_compile_definitions(${name} PRIVATE ${siphon_pch_definitions})
  target_compile_options(${name} PRIVATE -pthread)
  target_precompile_headers(${name} PRIVATE ${ARGN})
endfunction()

# siphon_apply_pch(): for every target under the source tree, reuse the
# precompiled header that matches its flags, or include <utility> instead.
function(siphon_apply_pch)
  set(dirs ${PROJECT_SOURCE_DIR})
  while(dirs)
    list(POP_FRONT dirs dir)
    get_property(sub DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
    get_property(tgts DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    list(APPEND dirs ${sub})
    foreach(t IN LISTS tgts)
      get_target_property(type ${t} TYPE)
      if(NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|OBJECT_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY)$")
        continue()
      endif()
      if(t STREQUAL "siphon_pch" OR t STREQUAL "siphon_pch_test")
        continue()
      endif()
      get_target_property(no_pch ${t} SIPHON_NO_PCH)
      if(NOT SIPHON_PCH OR no_pch
         OR dir MATCHES "^${PROJECT_SOURCE_DIR}/tests/fuzz")
        target_compile_options(${t} PRIVATE "${siphon_include_utility}")
        continue()
      endif()
      target_compile_definitions(${t} PRIVATE ${siphon_pch_definitions})
      target_compile_options(${t} PRIVATE -pthread)
      get_target_property(opts ${t} COMPILE_OPTIONS)
      if(TARGET siphon_pch_test AND SIPHON_TEST_OPT AND "${SIPHON_TEST_OPT}" IN_LIST opts)
        # GTest's usage requirement, also for a helper program of a test
        # that does not link GTest.
        target_compile_definitions(${t} PRIVATE GTEST_HAS_PTHREAD=1)
        target_precompile_headers(${t} REUSE_FROM siphon_pch_test)
      else()
        target_precompile_headers(${t} REUSE_FROM siphon_pch)
      endif()
    endforeach()
  endwhile()
endfunction()
