#include "cli/options.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "siphon/status.h"
#include "siphon/text.h"
#include "siphon/transport/session_transport.h"

namespace siphon::cli {
namespace {

// Tokens are short; this bounds what a wrong path (a log file, /dev/zero)
// can make the CLI read.
constexpr size_t kMaxTokenFileSize = 64 * 1024;

absl::Status addEntries(std::string_view value, std::vector<std::string>* out) {
  for (absl::string_view part : absl::StrSplit(asv(value), ',')) {
    absl::string_view entry = absl::StripAsciiWhitespace(part);
    if (entry.empty()) continue;
    std::string address(entry);
    std::string host, port;
    RETURN_IF_ERROR(net::splitHostPort(address, &host, &port));
    if (std::stoul(port) == 0) {
      return protoError(v1::INVALID_ARGUMENT,
                        absl::StrCat("bad address '", address, "': port 0 cannot be dialled"));
    }
    out->push_back(std::move(address));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> parseAgentList(const std::vector<std::string>& flags,
                                                        std::optional<std::string_view> env_value) {
  std::vector<std::string> agents;
  if (!flags.empty()) {
    for (const auto& f : flags) RETURN_IF_ERROR(addEntries(f, &agents));
  } else if (env_value) {
    RETURN_IF_ERROR(addEntries(*env_value, &agents));
  }
  if (agents.empty()) {
    return protoError(v1::INVALID_ARGUMENT,
                      "no agent address: pass --agent HOST:PORT or set SIPHON_AGENT");
  }
  return agents;
}

std::string trimTrailingWhitespace(std::string s) {
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

absl::StatusOr<std::string> readTokenFile(const std::string& path) {
  auto unreadable = [&](int err) {
    return protoError(v1::INVALID_ARGUMENT,
                      absl::StrCat("cannot read token file ", path, ": ", std::strerror(err)));
  };
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return unreadable(errno);
  std::string content;
  char buf[4096];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      // A directory opens fine and fails here with EISDIR.
      int err = errno;
      close(fd);
      return unreadable(err);
    }
    if (n == 0) break;
    content.append(buf, static_cast<size_t>(n));
    if (content.size() > kMaxTokenFileSize) {
      close(fd);
      return protoError(v1::INVALID_ARGUMENT,
                        absl::StrCat("token file ", path, " is larger than ", kMaxTokenFileSize,
                                     " bytes: not a token"));
    }
  }
  close(fd);
  std::string token = trimTrailingWhitespace(std::move(content));
  if (token.empty()) {
    return protoError(v1::INVALID_ARGUMENT, absl::StrCat("token file ", path, " is empty"));
  }
  return token;
}

absl::StatusOr<std::chrono::milliseconds> parseDuration(std::string_view s) {
  ASSIGN_OR_RETURN(auto d, siphon::parseDuration(s));
  // A timeout of nothing would fail every call: say so instead.
  if (d.count() < 1) {
    return protoError(v1::INVALID_ARGUMENT,
                      absl::StrCat("bad duration '", asv(s), "' (must be at least 1ms)"));
  }
  return d;
}

}  // namespace siphon::cli
