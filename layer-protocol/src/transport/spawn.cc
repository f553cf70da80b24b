#include "siphon/transport/spawn.h"

#include <atomic>
#include <cstdio>

namespace siphon::net {
namespace {

void toStderr(std::string_view what, std::string_view error) {
  std::fprintf(stderr, "siphon: coroutine %.*s failed: %.*s\n", static_cast<int>(what.size()),
               what.data(), static_cast<int>(error.size()), error.data());
}

std::atomic<SpawnFailureReporter> g_reporter{&toStderr};

}  // namespace

void setSpawnFailureReporter(SpawnFailureReporter reporter) {
  g_reporter.store(reporter ? reporter : &toStderr);
}

std::string describeException(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

void reportSpawnFailure(std::string_view what, std::exception_ptr e) {
  g_reporter.load()(what, describeException(e));
}

}  // namespace siphon::net
