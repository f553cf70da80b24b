#include "agent/steal/sk_lookup/sk_lookup_steering.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "loader/steal_program.h"
#include "siphon/status.h"

namespace siphon::agent::steal {
namespace {

// The packet families that reach the program for connections from `fd`:
// an AF_INET6 socket that is not IPV6_V6ONLY sends IPv4 packets when it
// connects to a v4-mapped address, and sk_lookup sees them as AF_INET.
absl::StatusOr<std::vector<int>> packetFamilies(int fd, int domain) {
  if (domain == AF_INET) return std::vector<int>{AF_INET};
  if (domain != AF_INET6) {
    return absl::InvalidArgumentError(absl::StrCat("socket of family ", domain, " is not IP"));
  }
  int v6only = 0;
  socklen_t len = sizeof(v6only);
  if (getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &len) != 0) {
    return lastErrnoStatus("getsockopt IPV6_V6ONLY");
  }
  if (v6only) return std::vector<int>{AF_INET6};
  return std::vector<int>{AF_INET6, AF_INET};
}

absl::StatusOr<int> socketDomain(int fd) {
  int domain = 0;
  socklen_t len = sizeof(domain);
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0) {
    return lastErrnoStatus("getsockopt SO_DOMAIN");
  }
  return domain;
}

// The source port `fd` will connect from, binding it first when needed.
// A connect() of an unbound socket picks its port only inside the connect,
// too late to exempt it: bind(port 0) reserves one now.
absl::StatusOr<uint16_t> sourcePort(int fd, int domain) {
  ASSIGN_OR_RETURN(SockAddr local, outgoing::localAddress(fd));
  if (uint16_t port = outgoing::portOf(local); port != 0) return port;
  const SockAddr any = outgoing::wildcardAddress(domain);
  if (bind(fd, any.get(), any.len) != 0) {
    return lastErrnoStatus("bind passthrough socket to an ephemeral port");
  }
  ASSIGN_OR_RETURN(local, outgoing::localAddress(fd));
  if (uint16_t port = outgoing::portOf(local); port != 0) return port;
  return absl::InternalError("passthrough socket has no port after bind");
}

class SkLookupSteering final : public Steering {
 public:
  explicit SkLookupSteering(std::unique_ptr<bpf::StealProgram> program)
      : program_(std::move(program)) {}
  ~SkLookupSteering() override { stop(); }

  std::string_view name() const override { return "sk_lookup"; }

  absl::Status addPort(uint16_t port) override {
    if (!program_->attached()) return absl::FailedPreconditionError("sk_lookup steering stopped");
    return program_->addPort(port);
  }

  absl::Status removePort(uint16_t port) override { return program_->removePort(port); }

  absl::Status exempt(int fd) override {
    ASSIGN_OR_RETURN(int domain, socketDomain(fd));
    ASSIGN_OR_RETURN(std::vector<int> families, packetFamilies(fd, domain));
    ASSIGN_OR_RETURN(uint16_t port, sourcePort(fd, domain));
    unexempt(fd);  // a stale record of a reused fd number
    Exemption& exemption = exemptions_[fd];
    exemption.port = port;
    for (int family : families) {
      absl::Status status = program_->exempt(family, port);
      if (!status.ok()) {
        unexempt(fd);
        return status;
      }
      exemption.families.push_back(family);
    }
    return absl::OkStatus();
  }

  void unexempt(int fd) override {
    // The keys exempt() added are recorded rather than read back from the
    // socket, so nothing here can fail on the socket's side. Deleting from a
    // hash map with a well-formed key fails only with ENOENT, which is fine.
    auto it = exemptions_.find(fd);
    if (it == exemptions_.end()) return;
    for (int family : it->second.families) {
      (void)program_->unexempt(family, it->second.port);
    }
    exemptions_.erase(it);
  }

  absl::StatusOr<SockAddr> originalDestination(int fd) override {
    // sk_lookup hands the SYN to our listener without rewriting it, so the
    // accepted socket's local address is the one the client connected to.
    return outgoing::localAddress(fd);
  }

  void stop() override { program_->detach(); }

 private:
  // The passthrough map entries of each exempted socket, by fd (exempt()
  // to unexempt(), which the caller runs before closing the socket).
  struct Exemption {
    uint16_t port = 0;
    std::vector<int> families;
  };

  std::unique_ptr<bpf::StealProgram> program_;
  std::unordered_map<int, Exemption> exemptions_;
};

// The cause with its code and payloads (the errno) kept, and a message that
// says which backend is missing.
absl::Status unavailable(const absl::Status& cause) {
  absl::Status status(cause.code(), absl::StrCat("sk_lookup unavailable: ", cause.message()));
  cause.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { status.SetPayload(url, payload); });
  return status;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Steering>> makeSkLookupSteering(
    int netns_fd, Listeners listeners, const std::vector<SourcePrefix>& exempt_sources) {
  absl::StatusOr<std::unique_ptr<bpf::StealProgram>> program = bpf::StealProgram::load();
  if (!program.ok()) return unavailable(program.status());
  if (absl::Status s = (*program)->setListener(AF_INET, listeners.v4); !s.ok()) {
    return unavailable(s);
  }
  if (listeners.v6 >= 0) {
    if (absl::Status s = (*program)->setListener(AF_INET6, listeners.v6); !s.ok()) {
      return unavailable(s);
    }
  }
  // The exempt sources before the attach: a probe is never steered, not
  // even in the first moments.
  for (const SourcePrefix& p : exempt_sources) {
    const std::array<uint8_t, 16> mapped = p.mapped();
    uint8_t addr[16];
    std::copy(mapped.begin(), mapped.end(), addr);
    if (absl::Status s = (*program)->exemptSource(addr, p.mappedBits()); !s.ok()) {
      return unavailable(s);
    }
  }
  // Attached last: the program never runs with an empty listeners map.
  if (absl::Status s = (*program)->attachToNetns(netns_fd); !s.ok()) return unavailable(s);
  return std::make_unique<SkLookupSteering>(std::move(*program));
}

}  // namespace siphon::agent::steal
