// Precompiled for every C++ target of the project (cmake/SiphonPch.cmake):
// the headers most of our files include, directly or through our own
// headers, and that cost most of a file's compile time (Boost.Asio alone is
// about half of it). A file still includes what it uses: the fuzz build and
// -DSIPHON_PCH=OFF compile without this.
//
// <utility> first: Boost 1.74's coroutines need it before Asio with GCC 12
// (without a precompiled header every file gets -include utility instead).
#include <utility>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <boost/asio.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "siphon/v1/common.pb.h"
#include "siphon/v1/files.pb.h"
#include "siphon/v1/frame.pb.h"
#include "siphon/v1/handshake.pb.h"
#include "siphon/v1/services.pb.h"
#include "siphon/v1/streams.pb.h"
