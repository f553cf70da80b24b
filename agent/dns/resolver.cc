// The resolver: c-ares on a thread of its own, with sockets made inside the
// target's netns, the search list and ndots applied as the target's libc
// would, and one answer per request. Over 600 lines because c-ares' callbacks,
// the jobs and the channels they use form one state machine on one thread;
// the parsing of resolv.conf and the hosts file is in resolv_conf.cc and
// hosts_file.cc.
#include "agent/dns/resolver.h"

#include <ares.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/dns/dns_answer.h"
#include "agent/dns/dns_names.h"
#include "siphon/status.h"

namespace siphon::agent::dns {
namespace {


int aresLibraryInit() {
  static const int status = ares_library_init(ARES_LIB_INIT_ALL);
  return status;
}

// c-ares' socket calls. The socket itself comes from the SocketFn (in the
// target's namespace); the rest are the plain system calls on that fd.
// Setting these also keeps c-ares from binding or setting options itself.
ares_socket_t aSocket(int domain, int type, int protocol, void* user) {
  auto& make = *static_cast<Resolver::SocketFn*>(user);
  auto fd = make(domain, type, protocol);
  if (!fd.ok()) {
    int err = errnoOf(fd.status());
    errno = err != 0 ? err : EACCES;
    return ARES_SOCKET_BAD;
  }
  return fd->release();
}

int aClose(ares_socket_t fd, void*) { return ::close(fd); }

int aConnect(ares_socket_t fd, const struct sockaddr* addr, ares_socklen_t len, void*) {
  return ::connect(fd, addr, len);
}

ares_ssize_t aRecvfrom(ares_socket_t fd, void* buf, size_t len, int flags, struct sockaddr* from,
                       ares_socklen_t* from_len, void*) {
  return ::recvfrom(fd, buf, len, flags, from, from_len);
}

bool isDatagram(int fd) {
  int type = 0;
  socklen_t len = sizeof(type);
  return ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_DGRAM;
}

// sendmsg rather than writev: MSG_NOSIGNAL, so a DNS server closing its TCP
// side never raises SIGPIPE in the agent.
ares_ssize_t aSendv(ares_socket_t fd, const struct iovec* iov, int iovcnt, void*) {
  struct msghdr msg {};
  msg.msg_iov = const_cast<struct iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(iovcnt);
  ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  // A connected UDP socket hands the ICMP error of an earlier datagram
  // (port unreachable: nothing listens there) to the next send. c-ares 1.18
  // then fails only the query being sent and leaves the earlier ones to
  // their timeout. Sent again, the datagram draws the error once more, on
  // the reading side, where c-ares fails every query of that socket at once.
  if (n < 0 && errno == ECONNREFUSED && isDatagram(fd)) n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  return n;
}

// c-ares keeps the pointer: it must outlive every channel.
const struct ares_socket_functions kSocketFunctions = {aSocket, aClose, aConnect, aRecvfrom,
                                                       aSendv};

absl::Status aresError(int status, std::string_view context) {
  return absl::InternalError(absl::StrCat(asv(context), ": ", ares_strerror(status)));
}

v1::DnsResponse dnsStatus(v1::DnsStatus status) {
  v1::DnsResponse r;
  r.set_status(status);
  return r;
}

// A failure of one query, as the caller sees it: a DNS status, or an error
// when something other than the DNS answer went wrong.
struct Outcome {
  v1::DnsStatus status = v1::DNS_STATUS_UNSPECIFIED;
  absl::Status error;
};

Outcome classify(int ares_status, bool has_records) {
  switch (ares_status) {
    case ARES_SUCCESS:
      return {has_records ? v1::DNS_OK : v1::DNS_NODATA, {}};
    case ARES_ENODATA:
      return {v1::DNS_NODATA, {}};
    case ARES_ENOTFOUND:
      return {v1::DNS_NXDOMAIN, {}};
    // The server answered but could not or would not resolve the name; a
    // reply c-ares cannot parse says the same of the server.
    case ARES_ESERVFAIL:
    case ARES_EFORMERR:
    case ARES_ENOTIMP:
    case ARES_EBADRESP:
      return {v1::DNS_SERVFAIL, {}};
    case ARES_EREFUSED:
      return {v1::DNS_REFUSED, {}};
    // No server answered. A refused connection (ICMP port unreachable from a
    // nameserver address where nothing listens) is one way of not
    // answering: glibc reports both as "no servers could be reached", and
    // onQueryDone already folds it into ETIMEOUT.
    case ARES_ETIMEOUT:
    case ARES_ECONNREFUSED:
      return {v1::DNS_TIMEOUT, {}};
    case ARES_EBADNAME:
      return {{},
              absl::InvalidArgumentError(
                  absl::StrCat("the name cannot be queried: ", ares_strerror(ares_status)))};
    case ARES_ENOMEM:
      return {{}, absl::ResourceExhaustedError("DNS resolver: out of memory")};
    case ARES_EDESTRUCTION:
    case ARES_ECANCELLED:
      return {{}, absl::UnavailableError("the agent's DNS resolver is stopping")};
    default:
      return {{}, aresError(ares_status, "DNS query")};
  }
}

// When several queries for one name fail (A and AAAA), the answer names the
// failure that says most: one that ends the search first, then "the name
// exists" (NODATA), then SERVFAIL, then NXDOMAIN.
int failureRank(v1::DnsStatus s) {
  switch (s) {
    case v1::DNS_TIMEOUT:
      return 5;
    case v1::DNS_REFUSED:
      return 4;
    case v1::DNS_NODATA:
      return 3;
    case v1::DNS_SERVFAIL:
      return 2;
    case v1::DNS_NXDOMAIN:
      return 1;
    default:
      return 0;
  }
}

// NXDOMAIN, NODATA and SERVFAIL move on to the next name of the search list,
// as glibc's res_nsearch does; anything else ends the search.
bool tryNextName(v1::DnsStatus s) {
  return s == v1::DNS_NXDOMAIN || s == v1::DNS_NODATA || s == v1::DNS_SERVFAIL;
}

void lowerTtl(v1::DnsResponse& r, std::optional<uint32_t>& ttl, std::optional<uint32_t> more) {
  if (!more) return;
  ttl = ttl ? std::min(*ttl, *more) : *more;
  r.set_ttl(*ttl);
}

}  // namespace

// One nameserver: a c-ares channel of its own, so that this file decides
// which server each try goes to (see resolver.h). c-ares 1.18 reports
// SERVFAIL, REFUSED and NOTIMP from its own server loop as "could not
// contact DNS servers" (ECONNREFUSED); with one server per channel and
// ARES_FLAG_NOCHECKRESP every answer reaches the callback with its rcode.
struct Resolver::Server {
  ares_channel ch = nullptr;
  std::map<int, short> socks;  // fd -> poll events c-ares waits for

  // Destroying a channel calls back its pending queries (ARES_EDESTRUCTION);
  // loop() does that while the jobs still exist. This is for a server with
  // nothing pending.
  ~Server() {
    if (ch != nullptr) ares_destroy(ch);
  }
};

// The servers of one resolv.conf.
struct Resolver::Channel {
  std::shared_ptr<const ResolvConf> conf;
  std::vector<std::unique_ptr<Server>> servers;
  int active = 0;     // queries sent and not yet called back
  size_t rotate = 0;  // "options rotate": the next job's first server
};

struct Resolver::Job {
  // One query type (A, AAAA or PTR) of the current candidate name.
  struct Part {
    explicit Part(int type) : qtype(type) {}
    int qtype;
    // Position in "for each attempt, for each server": the try goes to
    // servers[(start + pos) % servers.size()].
    size_t pos = 0;
    std::vector<bool> skip;          // servers that answered a failure or refused
    int server_said = ARES_SUCCESS;  // the last failure a server answered
    int status = ARES_SUCCESS;       // the outcome, once the part is done
    DnsAnswer answer;
  };

  uint64_t id = 0;
  bool reverse = false;
  Family family = Family::kAny;
  Done done;
  std::shared_ptr<Channel> channel;
  size_t start = 0;  // first server of each query (rotate)
  std::vector<std::string> candidates;
  size_t next = 0;           // index of the next candidate to query
  bool as_is_first = false;  // candidates[0] is the name as given (enough dots)

  // The candidate being queried.
  std::string name;
  std::vector<Part> parts;
  int outstanding = 0;    // parts not done yet
  bool starting = false;  // inside startCandidate: c-ares may call back at once

  // Across candidates (glibc's saved_herrno, got_nodata, got_servfail).
  std::optional<v1::DnsStatus> as_is_status;
  bool got_nodata = false;
  bool got_servfail = false;
};

struct Resolver::QueryArg {
  Resolver* resolver;
  uint64_t job_id;
  size_t part;
  size_t server;
};

Resolver::Resolver(std::unique_ptr<DnsConfigSource> config, SocketFn socket_fn,
                   ResolverLimits limits)
    : config_(std::move(config)), socket_fn_(std::move(socket_fn)), limits_(limits) {}

absl::StatusOr<std::unique_ptr<Resolver>> Resolver::start(std::unique_ptr<DnsConfigSource> config,
                                                          SocketFn socket_fn,
                                                          ResolverLimits limits) {
  if (int rc = aresLibraryInit(); rc != ARES_SUCCESS) return aresError(rc, "ares_library_init");
  std::unique_ptr<Resolver> r(new Resolver(std::move(config), std::move(socket_fn), limits));
  int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd < 0) return lastErrnoStatus("eventfd for the DNS resolver");
  r->wake_fd_.reset(efd);
  try {
    r->thread_ = std::thread([self = r.get()] {
      pthread_setname_np(pthread_self(), "siphon-dns");
      self->loop();
    });
  } catch (const std::system_error& e) {
    return absl::InternalError(absl::StrCat("start the DNS resolver thread: ", e.what()));
  }
  return r;
}

Resolver::~Resolver() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  uint64_t one = 1;
  if (wake_fd_.valid()) (void)!::write(wake_fd_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

void Resolver::resolve(v1::DnsRequest request, Done done) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) {
      lock.unlock();
      done(absl::UnavailableError("the agent's DNS resolver is stopping"));
      return;
    }
    incoming_.push_back({std::move(request), std::move(done)});
  }
  uint64_t one = 1;
  (void)!::write(wake_fd_.get(), &one, sizeof(one));
}

void Resolver::loop() {
  while (true) {
    std::deque<Incoming> batch;
    bool stop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      batch.swap(incoming_);
      stop = stopping_;
    }
    if (stop) {
      for (auto& in : batch)
        in.done(absl::UnavailableError("the agent's DNS resolver is stopping"));
      break;
    }
    if (!batch.empty()) {
      // One look at the target's files per batch: each request in it was
      // made before this load, so an edit made before a request is still
      // seen by it, and a burst of lookups costs one check, not one each.
      const DnsConfig cfg = config_->load();
      for (auto& in : batch) startJob(std::move(in), cfg);
    }
    reapChannels();
    pollOnce();
  }

  // Every pending query is called back with ARES_EDESTRUCTION as its channel
  // goes, which ends its job; shutting_down_ keeps them from starting more.
  shutting_down_ = true;
  std::vector<std::shared_ptr<Channel>> channels = std::move(retired_);
  if (current_) channels.push_back(std::move(current_));
  for (auto& c : channels) {
    for (auto& server : c->servers) {
      if (server->ch != nullptr) ares_destroy(std::exchange(server->ch, nullptr));
    }
  }
  while (!jobs_.empty()) {
    finish(jobs_.begin()->first, absl::UnavailableError("the agent's DNS resolver is stopping"));
  }
}

void Resolver::startJob(Incoming in, const DnsConfig& loaded) {
  const v1::DnsRequest& req = in.request;
  if (jobs_.size() >= limits_.max_pending) {
    in.done(absl::ResourceExhaustedError(absl::StrCat("too many DNS requests in flight (",
                                                      limits_.max_pending, "); try again later")));
    return;
  }
  auto job = std::make_unique<Job>();
  job->done = std::move(in.done);
  DnsConfig cfg = loaded;
  if (!cfg.resolv) cfg.resolv = std::make_shared<const ResolvConf>(defaultResolvConf());

  if (req.query_case() == v1::DnsRequest::kLookup) {
    const std::string& name = req.lookup().name();
    if (absl::Status s = validateName(name); !s.ok()) {
      job->done(absl::InvalidArgumentError(absl::StrCat("dns lookup: ", s.message())));
      return;
    }
    switch (req.lookup().family()) {
      case v1::ADDRESS_FAMILY_UNSPECIFIED:
        job->family = Family::kAny;
        break;
      case v1::ADDRESS_FAMILY_INET:
        job->family = Family::kInet;
        break;
      case v1::ADDRESS_FAMILY_INET6:
        job->family = Family::kInet6;
        break;
      default:
        job->done(absl::InvalidArgumentError(
            absl::StrCat("dns lookup: unknown address family ", req.lookup().family())));
        return;
    }
    // A literal resolves to itself, as getaddrinfo does.
    if (auto ip = parseIp(name)) {
      v1::DnsResponse r = dnsStatus(v1::DNS_NODATA);
      if (familyAccepts(job->family, ip->family)) {
        r.set_status(v1::DNS_OK);
        r.add_addresses(ip->text);
        r.add_names(ip->text);
      }
      job->done(std::move(r));
      return;
    }
    if (cfg.hosts) {
      if (auto m = cfg.hosts->lookup(name, job->family)) {
        v1::DnsResponse r = dnsStatus(v1::DNS_OK);
        for (auto& a : m->addresses) r.add_addresses(a);
        r.add_names(m->canonical);
        job->done(std::move(r));
        return;
      }
    }
    const ResolvConf& rc = *cfg.resolv;
    job->candidates = searchCandidates(name, rc.search, rc.ndots);
    job->as_is_first = name.back() != '.' &&
                       static_cast<int>(std::count(name.begin(), name.end(), '.')) >= rc.ndots;
  } else if (req.query_case() == v1::DnsRequest::kReverse) {
    const std::string& address = req.reverse().address();
    auto ip = parseIp(address);
    if (!ip) {
      job->done(absl::InvalidArgumentError(
          absl::StrCat("dns reverse: not an IPv4 or IPv6 address: \"", address, "\"")));
      return;
    }
    job->reverse = true;
    if (cfg.hosts) {
      if (auto names = cfg.hosts->reverse(*ip)) {
        v1::DnsResponse r = dnsStatus(v1::DNS_OK);
        for (auto& n : *names) r.add_names(n);
        job->done(std::move(r));
        return;
      }
    }
    job->candidates = {reverseName(*ip)};
  } else {
    job->done(absl::InvalidArgumentError("DNS request without a lookup or reverse query"));
    return;
  }

  auto channel = channelFor(cfg.resolv);
  if (!channel.ok()) {
    job->done(channel.status());
    return;
  }
  job->channel = *std::move(channel);
  if (job->channel->conf->rotate) {
    job->start = job->channel->rotate++ % job->channel->servers.size();
  }
  job->id = next_job_id_++;
  Job& j = *job;
  jobs_[j.id] = std::move(job);
  startCandidate(j);
}

absl::StatusOr<std::shared_ptr<Resolver::Channel>> Resolver::channelFor(
    const std::shared_ptr<const ResolvConf>& conf) {
  if (current_ && current_->conf == conf) return current_;
  // A new resolv.conf: queries in flight finish on the old servers.
  if (current_) {
    if (current_->active > 0) retired_.push_back(std::move(current_));
    current_.reset();
  }
  if (conf->nameservers.empty()) return absl::InternalError("resolv.conf without nameservers");

  auto c = std::make_shared<Channel>();
  c->conf = conf;
  for (const Nameserver& ns : conf->nameservers) {
    auto server = std::make_unique<Server>();
    // Every setting is given, so c-ares reads none of the agent's own
    // configuration (/etc/resolv.conf, /etc/hosts, LOCALDOMAIN,
    // RES_OPTIONS): it only reads what a channel leaves unset.
    struct ares_options o {};
    const int mask = ARES_OPT_FLAGS | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES | ARES_OPT_NDOTS |
                     ARES_OPT_DOMAINS | ARES_OPT_LOOKUPS | ARES_OPT_SERVERS | ARES_OPT_SORTLIST |
                     ARES_OPT_SOCK_STATE_CB | ARES_OPT_NOROTATE;
    // The search list is walked here (startCandidate), one ares_query per
    // name, so each answer says which name it is for; tries and servers
    // too (onQueryDone).
    o.flags = ARES_FLAG_NOSEARCH | ARES_FLAG_NOALIASES | ARES_FLAG_NOCHECKRESP;
    if (conf->use_vc) o.flags |= ARES_FLAG_USEVC;
    if (conf->edns0) o.flags |= ARES_FLAG_EDNS;
    o.timeout = conf->timeout_ms;
    o.tries = 1;
    o.ndots = conf->ndots;
    o.domains = nullptr;
    o.ndomains = 0;
    static char kDnsOnly[] = "b";  // the target's hosts file is read by HostsFile
    o.lookups = kDnsOnly;
    o.servers = nullptr;
    o.nservers = 0;
    o.sortlist = nullptr;
    o.nsort = 0;
    o.sock_state_cb = &Resolver::onSockState;
    o.sock_state_cb_data = server.get();
    if (int rc = ares_init_options(&server->ch, &o, mask); rc != ARES_SUCCESS) {
      server->ch = nullptr;
      return aresError(rc, "create a DNS channel");
    }
    ares_set_socket_functions(server->ch, &kSocketFunctions, &socket_fn_);

    struct ares_addr_port_node node {};
    node.family = ns.family;
    node.udp_port = ns.port;
    node.tcp_port = ns.port;
    if (inet_pton(ns.family, ns.address.c_str(), &node.addr) != 1) {
      return absl::InternalError(absl::StrCat("bad nameserver address ", ns.address));
    }
    if (int rc = ares_set_servers_ports(server->ch, &node); rc != ARES_SUCCESS) {
      return aresError(rc, absl::StrCat("set the DNS server ", ns.address));
    }
    c->servers.push_back(std::move(server));
  }
  current_ = c;
  return c;
}

void Resolver::startCandidate(Job& job) {
  job.name = job.candidates[job.next++];
  job.parts.clear();
  if (job.reverse) {
    job.parts.emplace_back(kTypePtr);
  } else {
    if (familyAccepts(job.family, AF_INET)) job.parts.emplace_back(kTypeA);
    if (familyAccepts(job.family, AF_INET6)) job.parts.emplace_back(kTypeAaaa);
  }
  for (auto& p : job.parts) p.skip.assign(job.channel->servers.size(), false);
  job.outstanding = static_cast<int>(job.parts.size());
  // A part may finish inside sendPart (c-ares calls back at once when it
  // cannot send). `starting` holds candidateDone back until every part is
  // sent, so the job outlives this loop.
  job.starting = true;
  for (size_t i = 0; i < job.parts.size(); ++i) sendPart(job, i);
  job.starting = false;
  if (job.outstanding == 0) candidateDone(job);
}

void Resolver::sendPart(Job& job, size_t part) {
  Channel& c = *job.channel;
  const size_t server = (job.start + job.parts[part].pos) % c.servers.size();
  ++c.active;
  // c-ares may call back before ares_query returns: nothing of `job` is
  // used after this call.
  ares_query(c.servers[server]->ch, job.name.c_str(), kClassIn, job.parts[part].qtype,
             &Resolver::onQuery, new QueryArg{this, job.id, part, server});
}

void Resolver::onQuery(void* arg, int status, int timeouts, unsigned char* abuf, int alen) {
  (void)timeouts;
  auto* q = static_cast<QueryArg*>(arg);
  q->resolver->onQueryDone(q, status, abuf, alen);
}

void Resolver::onQueryDone(QueryArg* arg, int status, const unsigned char* abuf, int alen) {
  std::unique_ptr<QueryArg> owned(arg);
  auto it = jobs_.find(arg->job_id);
  if (it == jobs_.end()) return;  // cannot happen: a job waits for all its queries
  Job& job = *it->second;
  --job.channel->active;
  Job::Part& part = job.parts[arg->part];

  if (status == ARES_SUCCESS) {
    auto answer = parseDnsAnswer(abuf, alen > 0 ? static_cast<size_t>(alen) : 0, part.qtype);
    if (answer.ok()) {
      part.answer = *std::move(answer);
    } else {
      status = ARES_EBADRESP;
    }
  }
  bool next_server = false;
  switch (status) {
    case ARES_ESERVFAIL:
    case ARES_EREFUSED:
    case ARES_ENOTIMP:
    case ARES_EFORMERR:
    case ARES_EBADRESP:
      // This server will not answer this question: ask the others.
      part.server_said = status;
      part.skip[arg->server] = true;
      next_server = true;
      break;
    case ARES_ECONNREFUSED:
      part.skip[arg->server] = true;
      next_server = true;
      break;
    case ARES_ETIMEOUT:
      next_server = true;
      break;
    default:
      // An answer (SUCCESS, ENODATA, ENOTFOUND) or a local failure.
      break;
  }
  if (next_server) {
    const size_t n = job.channel->servers.size();
    const size_t tries = n * static_cast<size_t>(job.channel->conf->attempts);
    while (!shutting_down_ && ++part.pos < tries) {
      if (!part.skip[(job.start + part.pos) % n]) {
        sendPart(job, arg->part);
        return;
      }
    }
    status = part.server_said != ARES_SUCCESS ? part.server_said : ARES_ETIMEOUT;
  }
  part.status = status;
  if (--job.outstanding == 0 && !job.starting) candidateDone(job);
}

void Resolver::candidateDone(Job& job) {
  const uint64_t id = job.id;
  v1::DnsResponse ok = dnsStatus(v1::DNS_OK);
  std::optional<uint32_t> ttl;
  std::optional<v1::DnsStatus> failure;
  std::string canonical;
  for (const Job::Part& p : job.parts) {
    const bool has_records = !p.answer.addresses.empty() || !p.answer.names.empty();
    Outcome o = classify(p.status, has_records);
    if (!o.error.ok()) {
      finish(id, o.error);
      return;
    }
    if (o.status == v1::DNS_OK) {
      if (canonical.empty()) canonical = p.answer.canonical;
      for (const auto& a : p.answer.addresses) ok.add_addresses(a);
      for (const auto& n : p.answer.names) ok.add_names(n);
      lowerTtl(ok, ttl, p.answer.ttl);
    } else if (!failure || failureRank(o.status) > failureRank(*failure)) {
      failure = o.status;
    }
  }
  if (ok.addresses_size() > 0 || ok.names_size() > 0) {
    if (!job.reverse) ok.add_names(canonical);
    finish(id, std::move(ok));
    return;
  }

  const v1::DnsStatus status = failure.value_or(v1::DNS_NODATA);
  if (job.next == 1 && job.as_is_first) job.as_is_status = status;
  if (status == v1::DNS_NODATA) job.got_nodata = true;
  if (status == v1::DNS_SERVFAIL) job.got_servfail = true;
  if (tryNextName(status) && job.next < job.candidates.size() && !shutting_down_) {
    startCandidate(job);
    return;
  }
  v1::DnsStatus final_status = status;
  if (tryNextName(status)) {
    // The search list is exhausted: glibc reports what the name as given
    // got when it was tried first, else that some name exists (NODATA),
    // else a server failure, else NXDOMAIN.
    if (job.as_is_status) {
      final_status = *job.as_is_status;
    } else if (job.got_nodata) {
      final_status = v1::DNS_NODATA;
    } else if (job.got_servfail) {
      final_status = v1::DNS_SERVFAIL;
    }
  }
  finish(id, dnsStatus(final_status));
}

void Resolver::finish(uint64_t job_id, absl::StatusOr<v1::DnsResponse> result) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Done done = std::move(it->second->done);
  jobs_.erase(it);
  done(std::move(result));
}

void Resolver::reapChannels() {
  auto idle = [](const std::shared_ptr<Channel>& c) { return c->active == 0; };
  retired_.erase(std::remove_if(retired_.begin(), retired_.end(), idle), retired_.end());
}

void Resolver::onSockState(void* data, int fd, int readable, int writable) {
  auto* server = static_cast<Server*>(data);
  short events = static_cast<short>((readable ? POLLIN : 0) | (writable ? POLLOUT : 0));
  if (events == 0) {
    server->socks.erase(fd);
  } else {
    server->socks[fd] = events;
  }
}

void Resolver::pollOnce() {
  std::vector<pollfd> fds;
  std::vector<Server*> owners;
  fds.push_back({wake_fd_.get(), POLLIN, 0});
  owners.push_back(nullptr);
  int timeout_ms = -1;
  std::vector<Server*> servers;
  auto collect = [&servers](Channel* c) {
    if (c->active == 0) return;
    for (auto& s : c->servers) servers.push_back(s.get());
  };
  if (current_) collect(current_.get());
  for (auto& c : retired_) collect(c.get());
  for (Server* s : servers) {
    for (const auto& [fd, events] : s->socks) {
      fds.push_back({fd, events, 0});
      owners.push_back(s);
    }
    struct timeval tv {};
    if (ares_timeout(s->ch, nullptr, &tv) != nullptr) {
      int ms = static_cast<int>(tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000);
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    }
  }

  int n = ::poll(fds.data(), fds.size(), timeout_ms);
  if (n < 0) return;  // EINTR: go round again
  if (fds[0].revents != 0) {
    uint64_t count;
    (void)!::read(wake_fd_.get(), &count, sizeof(count));
  }
  for (size_t i = 1; i < fds.size(); ++i) {
    const short ev = fds[i].revents;
    if (ev == 0 || (ev & POLLNVAL) != 0) continue;
    // An error (ICMP port unreachable on a UDP socket) is reported as
    // readable: c-ares reads, gets the error and fails the query over.
    ares_socket_t r = (ev & (POLLIN | POLLERR | POLLHUP)) ? fds[i].fd : ARES_SOCKET_BAD;
    ares_socket_t w = (ev & (POLLOUT | POLLERR | POLLHUP)) ? fds[i].fd : ARES_SOCKET_BAD;
    ares_process_fd(owners[i]->ch, r, w);
  }
  // Timeouts. A server whose channel has nothing pending is cheap to visit.
  for (Server* s : servers) ares_process_fd(s->ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
}

}  // namespace siphon::agent::dns
