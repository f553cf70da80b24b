// Small helpers shared by the agent/runtime tests.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "absl/status/status.h"

namespace siphon::agent::runtime::testing {

// A status message as std::string: Debian's absl::string_view is not
// std::string_view, and gmock's string matchers want the latter.
inline std::string msg(const absl::Status& s) { return std::string(s.message()); }

// A temporary directory (short path: unix socket paths must fit 108 bytes),
// removed with its content.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/siphon-rt-XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  bool ok() const { return !path_.empty(); }
  std::string path(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace siphon::agent::runtime::testing
