// Precompiled for the test code (tests/unit, tests/privileged, tests/deploy),
// which compiles with its own optimisation flag (SIPHON_TEST_OPT) and so
// needs its own precompiled header: common.h, then this.
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
