// Resolver: DNS as the target would resolve it. c-ares runs on a thread of
// its own, configured from the target's resolv.conf (DnsConfigSource); its
// sockets are made by `SocketFn`, which the agent points at the NetnsWorker
// so that every DNS socket lives in the target's network namespace. The
// target's /etc/hosts is consulted before DNS, as "hosts: files dns" does.
//
// Each query goes round the nameservers like glibc's res_send: for each of
// `attempts` rounds, each server in order (rotated with "options rotate"),
// waiting `timeout` for each; a server that answers SERVFAIL, REFUSED or
// NOTIMP, or refuses the connection, is skipped for the rest of that query.
// An answer with NOERROR or NXDOMAIN ends it. If no server gave one, the
// query failed with what the last answering server said, else TIMEOUT.
//
// A lookup walks the search list (dns_names.h) like glibc's res_nsearch:
// NXDOMAIN, NODATA and SERVFAIL try the next name; a timeout or REFUSED ends
// the walk. With no family both A and AAAA are asked for each name, and a
// name answers if either has addresses (A first in the answer). Reverse
// lookups ask the hosts file, then PTR. DNS outcomes (NXDOMAIN, NODATA,
// TIMEOUT, SERVFAIL, REFUSED) are results in DnsResponse.status, not errors.
//
// Threads: resolve() from any thread. `done` runs on the resolver's thread,
// exactly once per resolve(), and must not block (post the result to the
// event loop). The destructor answers what is still pending with
// UNAVAILABLE and joins the thread; call it from outside `done`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "agent/dns/dns_config.h"
#include "siphon/v1/services.pb.h"

namespace siphon::agent::dns {

struct ResolverLimits {
  // Requests being resolved at once; more are answered RESOURCE_EXHAUSTED.
  size_t max_pending = 1024;
};

class Resolver {
 public:
  // socket(2) for c-ares, close-on-exec and non-blocking. Called on the
  // resolver's thread; it may block (NetnsWorker::socketSync).
  using SocketFn = std::function<absl::StatusOr<UniqueFd>(int domain, int type, int protocol)>;
  using Done = std::function<void(absl::StatusOr<v1::DnsResponse>)>;

  // Starts the thread. INTERNAL when c-ares or the thread cannot start.
  static absl::StatusOr<std::unique_ptr<Resolver>> start(std::unique_ptr<DnsConfigSource> config,
                                                         SocketFn socket_fn,
                                                         ResolverLimits limits = {});
  ~Resolver();

  Resolver(const Resolver&) = delete;
  Resolver& operator=(const Resolver&) = delete;

  // Answers `request` through `done`: a DnsResponse (status DNS_OK with
  // addresses/names, or a DNS failure status), or an error status:
  //   InvalidArgument    no query, an empty or malformed name, a name over
  //                      253 bytes, an unknown family, a reverse address
  //                      that is not an IPv4/IPv6 literal;
  //   ResourceExhausted  ResolverLimits::max_pending requests in flight;
  //   Unavailable        the resolver is stopping, or sockets cannot be made;
  //   Internal           c-ares failed.
  void resolve(v1::DnsRequest request, Done done);

 private:
  struct Server;
  struct Channel;
  struct Job;
  struct QueryArg;
  struct Incoming {
    v1::DnsRequest request;
    Done done;
  };

  Resolver(std::unique_ptr<DnsConfigSource> config, SocketFn socket_fn, ResolverLimits limits);
  void loop();
  void startJob(Incoming in, const DnsConfig& cfg);
  absl::StatusOr<std::shared_ptr<Channel>> channelFor(
      const std::shared_ptr<const ResolvConf>& conf);
  void startCandidate(Job& job);
  void sendPart(Job& job, size_t part);
  void onQueryDone(QueryArg* arg, int status, const unsigned char* abuf, int alen);
  void candidateDone(Job& job);
  void finish(uint64_t job_id, absl::StatusOr<v1::DnsResponse> result);
  void reapChannels();
  void pollOnce();

  static void onSockState(void* data, int fd, int readable, int writable);
  static void onQuery(void* arg, int status, int timeouts, unsigned char* abuf, int alen);

  std::unique_ptr<DnsConfigSource> config_;
  SocketFn socket_fn_;
  ResolverLimits limits_;
  UniqueFd wake_fd_;  // eventfd: resolve() and the destructor wake the loop

  std::mutex mu_;
  std::deque<Incoming> incoming_;  // guarded by mu_
  bool stopping_ = false;          // guarded by mu_

  // Resolver thread only.
  bool shutting_down_ = false;
  uint64_t next_job_id_ = 1;
  std::map<uint64_t, std::unique_ptr<Job>> jobs_;
  std::shared_ptr<Channel> current_;
  // Channels of an older resolv.conf, kept until their queries finish.
  std::vector<std::shared_ptr<Channel>> retired_;

  std::thread thread_;
};

}  // namespace siphon::agent::dns
