// libFuzzer target: what a client's requests and stream opens carry, into the
// agent code that parses it, and the files of a target the agent reads for
// a client. The first input byte picks the area:
//
//   0  a v1::Request (protobuf bytes): env globs (EnvFilter), file requests
//      (--fs-mode policy, then RootFs path resolution of the read-only
//      operations in a fixture root), DNS lookups and reverses (validateName,
//      IP literals, hosts file, search list, reverse names), steal HTTP
//      filters (RequestFilter::compile and matching);
//   1  a v1::StreamOpen: outgoing addresses (IP literals, abstract and
//      in-root unix paths), capture specs (and the pcap filter compiled as
//      the capture does, on a dead handle);
//   2  a /proc/PID/environ image and a runtime env list (parseEnviron,
//      parseEnvList, mergeEnv);
//   3  a DNS response message for a query type (parseDnsAnswer);
//   4  a target's resolv.conf and /etc/hosts and a name looked up with them
//      as the resolver does;
//   5  a v1::SocketAddress of a datagram (fromProto, forFamily, toProto).
//
// Nothing may crash, leak, touch memory it does not own or hit undefined
// behaviour; the checks below are properties the parsers promise in their
// headers. The fixture root holds only directories, a file and symlinks
// that point out of it; the fuzzer never runs an operation that writes.
#include <fcntl.h>
#include <linux/fs.h>
#include <pcap/pcap.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "agent/capture/capture_spec.h"
#include "agent/dns/dns_answer.h"
#include "agent/dns/dns_names.h"
#include "agent/dns/hosts_file.h"
#include "agent/dns/resolv_conf.h"
#include "agent/files/fs_policy.h"
#include "agent/files/root_fs.h"
#include "agent/outgoing/address.h"
#include "agent/steal/http/filter.h"
#include "agent/steal/http/request_head.h"
#include "agent/target/environ.h"
#include "google/protobuf/stubs/logging.h"
#include "siphon/status.h"
#include "siphon/v1/services.pb.h"
#include "siphon/v1/streams.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace siphon::agent {
namespace {

using fuzz::check;
using fuzz::Input;

// ------------------------------------------------------------ fixture root

struct Fixture {
  std::string dir;
  int root_fd = -1;
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void removeFixture() {
  Fixture& f = fixture();
  if (f.root_fd >= 0) ::close(f.root_fd);
  std::error_code ec;
  if (!f.dir.empty()) std::filesystem::remove_all(f.dir, ec);
}

// A small tree with the shapes path resolution must contain: nested
// directories, a file, absolute and relative symlinks leading out, a loop,
// a magic link.
void makeFixture() {
  char tmpl[] = "/tmp/siphon-fuzz-root.XXXXXX";
  check(::mkdtemp(tmpl) != nullptr, "mkdtemp");
  Fixture& f = fixture();
  f.dir = tmpl;
  namespace fs = std::filesystem;
  fs::create_directories(f.dir + "/etc/ssl");
  fs::create_directories(f.dir + "/var/run");
  FILE* file = std::fopen((f.dir + "/etc/hosts").c_str(), "w");
  check(file != nullptr, "fixture file");
  std::fputs("127.0.0.1 localhost\n", file);
  std::fclose(file);
  fs::create_symlink("/etc", f.dir + "/abs");
  fs::create_symlink("../../../../etc/passwd", f.dir + "/var/up");
  fs::create_symlink("loop", f.dir + "/loop");
  fs::create_symlink("/proc/self/root", f.dir + "/magic");
  fs::create_symlink("hosts", f.dir + "/etc/h");
  f.root_fd = ::open(f.dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  check(f.root_fd >= 0, "open fixture root");
  std::atexit(removeFixture);
}

// ------------------------------------------------------------ requests

void fuzzEnvRequest(const v1::EnvRequest& req) {
  EnvFilter filter = EnvFilter::fromRequest(req);
  std::vector<v1::EnvVar> vars;
  for (const char* name : {"HOME", "PATH", "SECRET_TOKEN", "a/b", ""}) {
    v1::EnvVar v;
    v.set_name(name);
    v.set_value("x");
    vars.push_back(v);
  }
  for (const std::string& p : req.include()) {
    v1::EnvVar v;
    v.set_name(p);
    vars.push_back(v);
  }
  std::sort(vars.begin(), vars.end(),
            [](const v1::EnvVar& a, const v1::EnvVar& b) { return a.name() < b.name(); });
  v1::EnvResponse out = filterEnv(vars, filter);
  check(static_cast<size_t>(out.vars_size()) <= vars.size(), "filterEnv only removes");
  for (const v1::EnvVar& v : out.vars()) check(filter.matches(v.name()), "kept vars match");
}

// Flags a fuzzed open may pass to the kernel: reading only, whatever the
// client asked (the policy functions saw the client's own flags).
int readOnlyFlags(uint32_t flags) {
  return static_cast<int>(flags) & (O_DIRECTORY | O_NOFOLLOW | O_PATH | O_NOATIME | O_LARGEFILE);
}

void fuzzFileRequest(const v1::FileRequest& req) {
  using agent::FsMode;
  using R = v1::FileRequest;
  (void)files::fileOpName(req);
  (void)files::fileRequestTarget(req);
  const bool writes = files::isWriteLike(req);
  check(!files::checkFsMode(FsMode::kOff, req).ok(), "--fs-mode off refuses everything");
  check(files::checkFsMode(FsMode::kReadWrite, req).ok(), "--fs-mode rw allows everything");
  absl::Status ro = files::checkFsMode(FsMode::kReadOnly, req);
  check(ro.ok() == !writes, "--fs-mode ro refuses exactly the write-like requests");
  if (!ro.ok()) check(errnoOf(ro) == EROFS, "--fs-mode ro answers EROFS");

  const files::RootFs root(fixture().root_fd);
  switch (req.op_case()) {
    case R::kOpen: {
      auto fd = root.open(req.open().path(), readOnlyFlags(req.open().flags()), 0);
      (void)fd;
      break;
    }
    case R::kOpendir:
      (void)root.openDir(req.opendir().path());
      break;
    case R::kStat:
      (void)root.stat(req.stat().path(), req.stat().follow_symlinks());
      break;
    case R::kStatfs:
      (void)root.statfs(req.statfs().path());
      break;
    case R::kAccess:
      (void)root.access(req.access().path(), static_cast<int>(req.access().mode()), true);
      break;
    case R::kReadlink:
      (void)root.readlink(req.readlink().path());
      break;
    case R::kRename: {
      // Both parents are resolved before renameat2 runs; NOREPLACE with
      // EXCHANGE is EINVAL from the kernel, so nothing moves.
      absl::Status s =
          root.rename(req.rename().from(), req.rename().to(), RENAME_NOREPLACE | RENAME_EXCHANGE);
      check(!s.ok(), "an invalid rename never succeeds");
      break;
    }
    case R::kMkdir:
    case R::kRmdir:
    case R::kUnlink:
    case R::kTruncate:
    case R::kChmod:
    case R::kChown:
    case R::kUtimens: {
      // These write: only the resolution of the path as an O_PATH object.
      std::string_view path;
      if (req.has_mkdir()) path = req.mkdir().path();
      if (req.has_rmdir()) path = req.rmdir().path();
      if (req.has_unlink()) path = req.unlink().path();
      if (req.has_truncate()) path = req.truncate().path();
      if (req.has_chmod()) path = req.chmod().path();
      if (req.has_chown()) path = req.chown().path();
      if (req.has_utimens()) path = req.utimens().path();
      (void)root.resolve(path, O_PATH | O_NOFOLLOW);
      break;
    }
    default:
      break;
  }
}

const dns::HostsFile& fixedHosts() {
  static const dns::HostsFile hosts = dns::HostsFile::parse(
      "127.0.0.1 localhost\n::1 localhost ip6-localhost\n10.0.0.5 db.internal db\n");
  return hosts;
}

// As Resolver::startJob takes a lookup or a reverse apart before c-ares.
void fuzzDnsQuery(const v1::DnsRequest& req, const dns::ResolvConf& rc,
                  const dns::HostsFile& hosts) {
  if (req.has_lookup()) {
    const std::string& name = req.lookup().name();
    absl::Status valid = dns::validateName(name);
    if (!valid.ok()) {
      check(absl::IsInvalidArgument(valid), "a bad name is INVALID_ARGUMENT");
      return;
    }
    check(!name.empty() && name.size() <= dns::kMaxNameLength + 1, "valid names are short");
    if (auto ip = dns::parseIp(name)) {
      auto again = dns::parseIp(ip->text);
      check(again.has_value() && *again == *ip, "a normalised literal parses to itself");
      return;
    }
    for (dns::Family fam : {dns::Family::kAny, dns::Family::kInet, dns::Family::kInet6}) {
      (void)hosts.lookup(name, fam);
    }
    std::vector<std::string> c = dns::searchCandidates(name, rc.search, rc.ndots);
    check(!c.empty(), "a valid name has candidates");
    check(c.size() <= rc.search.size() + 1, "one candidate per search domain, plus the name");
  } else if (req.has_reverse()) {
    auto ip = dns::parseIp(req.reverse().address());
    if (!ip) return;
    check(ip->bytes.size() == (ip->family == AF_INET ? 4u : 16u), "address length");
    (void)hosts.reverse(*ip);
    std::string name = dns::reverseName(*ip);
    check(dns::validateName(name).ok(), "reverse names are valid names");
  }
}

const steal::http::RequestHead& sampleHead(int i) {
  static const std::vector<steal::http::RequestHead> heads = [] {
    std::vector<steal::http::RequestHead> h(3);
    h[0].method = "GET";
    h[0].target = "/api/v1/users?id=7";
    h[0].headers = {{"Host", "svc"}, {"X-User", "alice"}, {"x-user", "bob"}};
    h[1].method = "POST";
    h[1].target = "http://svc:8080/upload";
    h[1].version = 20;
    h[1].headers = {{"host", "svc"}, {"content-type", "application/json"}};
    h[2].method = "OPTIONS";
    h[2].target = "*";
    h[2].version = 10;
    return h;
  }();
  return heads[i % heads.size()];
}

void fuzzHttpFilter(const v1::HttpFilter& f) {
  auto compiled = steal::http::RequestFilter::compile(f);
  if (!compiled.ok()) {
    check(absl::IsInvalidArgument(compiled.status()), "a bad filter is INVALID_ARGUMENT");
    return;
  }
  check(!(*compiled)->description().empty(), "a filter describes itself");
  for (int i = 0; i < 3; ++i) (void)(*compiled)->matches(sampleHead(i));
}

void fuzzRequest(std::string_view bytes) {
  v1::Request req;
  if (!req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  switch (req.body_case()) {
    case v1::Request::kEnv:
      fuzzEnvRequest(req.env());
      break;
    case v1::Request::kFile:
      fuzzFileRequest(req.file());
      break;
    case v1::Request::kDns:
      fuzzDnsQuery(req.dns(), dns::defaultResolvConf(), fixedHosts());
      break;
    case v1::Request::kSteal:
      if (req.steal().has_http_filter()) fuzzHttpFilter(req.steal().http_filter());
      break;
    default:
      // info, mirror, unsubscribe, sessions: numbers only, nothing parsed.
      break;
  }
}

// ------------------------------------------------------------ stream opens

void checkIpAddress(const outgoing::SockAddr& a) {
  check(a.family() == AF_INET || a.family() == AF_INET6, "an IP literal is IPv4 or IPv6");
  (void)outgoing::formatAddress(a);
  v1::SocketAddress wire = outgoing::toProto(a);
  auto back = outgoing::fromProto(wire);
  check(back.ok(), "the wire form of an address parses");
  check(outgoing::portOf(*back) == outgoing::portOf(a), "the port survives the wire form");
  auto v6 = outgoing::forFamily(a, AF_INET6);
  check(v6.ok(), "every IP address has an IPv6 form");
  (void)outgoing::forFamily(a, AF_INET);
}

void fuzzOutgoing(const v1::OutgoingConnect& c) {
  const uint16_t port = static_cast<uint16_t>(c.port());
  if (auto a = outgoing::ipAddress(c.host(), port)) checkIpAddress(*a);
  const std::string& path = c.unix_path();
  if (path.empty()) return;
  if (path[0] == '@') {
    auto a = outgoing::abstractUnixAddress(path);
    if (a.ok()) {
      check(a->family() == AF_UNIX, "an abstract address is AF_UNIX");
      check(outgoing::formatAddress(*a).front() == '@', "an abstract address prints with @");
    }
    return;
  }
  auto fd = outgoing::openInRoot(fixture().root_fd, path);
  if (fd.ok()) (void)outgoing::formatAddress(outgoing::procFdUnixAddress(fd->get()));
}

void fuzzCapture(const v1::CaptureStart& start, size_t max_record) {
  auto spec = capture::captureSpec(start, max_record);
  if (!spec.ok()) {
    check(absl::IsInvalidArgument(spec.status()), "a bad capture is INVALID_ARGUMENT");
    return;
  }
  check(!spec->interface.empty() && spec->interface.size() <= 15, "interface name fits IFNAMSIZ");
  check(spec->snaplen > 0 && spec->snaplen + 16 <= max_record, "a record fits one frame");
  check(spec->filter.size() <= capture::kMaxFilterBytes, "filter within bound");
  // The capture compiles the filter for its link type; a dead handle
  // compiles it the same way without a socket. Long filters only cost time.
  if (spec->filter.size() > 4096) return;
  pcap_t* p = pcap_open_dead(DLT_LINUX_SLL2, static_cast<int>(spec->snaplen));
  check(p != nullptr, "pcap_open_dead");
  bpf_program program{};
  if (pcap_compile(p, &program, spec->filter.c_str(), 1, PCAP_NETMASK_UNKNOWN) == 0) {
    pcap_freecode(&program);
  }
  pcap_close(p);
}

void fuzzStreamOpen(Input& in) {
  const size_t max_record = in.upTo(70000);
  std::string_view bytes = in.rest();
  v1::StreamOpen open;
  if (!open.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  if (open.has_outgoing()) fuzzOutgoing(open.outgoing());
  if (open.has_capture()) fuzzCapture(open.capture(), max_record);
}

// ------------------------------------------------------------ target files

void fuzzEnviron(Input& in) {
  std::string_view runtime = in.shortString();
  std::string_view raw = in.rest();
  auto process = parseEnviron(raw);
  check(process.ok(), "parseEnviron never fails");
  for (size_t i = 0; i < process->size(); ++i) {
    const v1::EnvVar& v = (*process)[i];
    check(!v.name().empty(), "no empty names");
    check(v.name().find('=') == std::string::npos, "names hold no '='");
    check(v1::EnvVar().ParseFromString(v.SerializeAsString()), "vars are valid proto3 strings");
    if (i > 0) check((*process)[i - 1].name() < v.name(), "sorted, no duplicates");
  }
  std::vector<std::string> list;
  size_t pos = 0;
  while (pos <= runtime.size()) {
    size_t end = runtime.find('\n', pos);
    if (end == std::string_view::npos) end = runtime.size();
    list.emplace_back(runtime.substr(pos, end - pos));
    pos = end + 1;
  }
  auto runtime_env = parseEnvList(list);
  check(runtime_env.ok(), "parseEnvList never fails");
  std::vector<v1::EnvVar> merged = mergeEnv(*runtime_env, *process);
  check(merged.size() >= process->size() && merged.size() >= runtime_env->size(),
        "merge keeps every name");
  check(merged.size() <= process->size() + runtime_env->size(), "merge adds nothing");
}

void fuzzDnsAnswer(Input& in) {
  // The query types the resolver sends (resolver.cc).
  static constexpr int kTypes[] = {dns::kTypeA, dns::kTypeAaaa, dns::kTypePtr};
  const int qtype = kTypes[in.byte() % 3];
  std::string_view msg = in.rest();
  // A copy of exactly the message's size, so ASan sees any read past it.
  std::vector<unsigned char> buf(msg.begin(), msg.end());
  auto answer = dns::parseDnsAnswer(buf.data(), buf.size(), qtype);
  if (!answer.ok()) {
    check(absl::IsInvalidArgument(answer.status()), "a malformed answer is INVALID_ARGUMENT");
    return;
  }
  for (const std::string& a : answer->addresses) {
    check(dns::parseIp(a).has_value(), "answer addresses are IP literals");
  }
}

void fuzzDnsConfig(Input& in) {
  v1::DnsRequest req;
  std::string_view name = in.shortString();
  if (in.byte() & 1) {
    req.mutable_reverse()->set_address(std::string(name));
  } else {
    req.mutable_lookup()->set_name(std::string(name));
  }
  const size_t asked = in.upTo(0xffff);  // where resolv.conf ends
  std::string_view files = in.rest();
  const size_t cut = std::min(asked, files.size());
  dns::ResolvConf rc = dns::parseResolvConf(files.substr(0, cut));
  check(rc.nameservers.size() <= dns::ResolvConf::kMaxNameservers, "at most three servers");
  check(rc.ndots >= 0 && rc.ndots <= dns::ResolvConf::kMaxNdots, "ndots clamped");
  check(rc.timeout_ms >= 1000 && rc.timeout_ms <= 30000, "timeout clamped");
  check(rc.attempts >= 1 && rc.attempts <= dns::ResolvConf::kMaxAttempts, "attempts clamped");
  for (const dns::Nameserver& ns : rc.nameservers) {
    auto ip = dns::parseIp(ns.address);
    check(ip.has_value() && ip->family == ns.family, "nameservers are literals of their family");
  }
  dns::HostsFile hosts = dns::HostsFile::parse(files.substr(cut));
  for (const auto& e : hosts.entries()) check(!e.names.empty(), "host entries have a name");
  fuzzDnsQuery(req, rc, hosts);
}

void fuzzDatagramPeer(std::string_view bytes) {
  v1::SocketAddress wire;
  if (!wire.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  auto a = outgoing::fromProto(wire);
  if (!a.ok()) {
    check(absl::IsInvalidArgument(a.status()), "a bad peer is INVALID_ARGUMENT");
    return;
  }
  checkIpAddress(*a);
}

// ------------------------------------------------------------ seeds

std::string pb(const google::protobuf::Message& m) { return m.SerializeAsString(); }

std::vector<std::string> seeds() {
  std::vector<std::string> out;
  auto request = [&](auto fill) {
    v1::Request r;
    r.set_request_id(1);
    fill(r);
    out.push_back(std::string(1, '\0') + pb(r));
  };
  request([](v1::Request& r) {
    r.mutable_env()->add_include("HOME*");
    r.mutable_env()->add_exclude("[!A-Z]*");
  });
  request([](v1::Request& r) {
    r.mutable_file()->mutable_open()->set_path("/etc/hosts");
    r.mutable_file()->mutable_open()->set_flags(O_RDONLY);
  });
  request([](v1::Request& r) {
    r.mutable_file()->mutable_open()->set_path("var/up");
    r.mutable_file()->mutable_open()->set_flags(O_WRONLY | O_CREAT | O_TRUNC);
  });
  request([](v1::Request& r) {
    r.mutable_file()->mutable_stat()->set_path("/abs/../magic/etc");
    r.mutable_file()->mutable_stat()->set_follow_symlinks(true);
  });
  request([](v1::Request& r) { r.mutable_file()->mutable_readlink()->set_path("/etc/h"); });
  request([](v1::Request& r) {
    r.mutable_file()->mutable_rename()->set_from("etc/ssl/.");
    r.mutable_file()->mutable_rename()->set_to("/../var/run/");
  });
  request([](v1::Request& r) { r.mutable_file()->mutable_mkdir()->set_path("loop/x"); });
  request([](v1::Request& r) {
    r.mutable_file()->mutable_access()->set_path("etc");
    r.mutable_file()->mutable_access()->set_mode(W_OK | X_OK);
  });
  request([](v1::Request& r) {
    r.mutable_dns()->mutable_lookup()->set_name("db");
    r.mutable_dns()->mutable_lookup()->set_family(v1::ADDRESS_FAMILY_INET);
  });
  request([](v1::Request& r) { r.mutable_dns()->mutable_lookup()->set_name("api.svc.cluster."); });
  request([](v1::Request& r) { r.mutable_dns()->mutable_reverse()->set_address("fd00::1"); });
  request([](v1::Request& r) {
    auto* f = r.mutable_steal()->mutable_http_filter();
    auto* h = f->add_headers();
    h->set_name("X-User");
    h->set_value_regex("^alice$");
    f->set_path_regex("^/api/v[0-9]+/");
    f->set_method("GET");
  });
  request([](v1::Request& r) {
    r.mutable_steal()->set_port(80);
    r.mutable_steal()->mutable_http_filter()->set_path_regex("(a");
    r.mutable_steal()->mutable_http_filter()->set_match_any(true);
  });

  auto open = [&](uint16_t max_record, auto fill) {
    v1::StreamOpen o;
    o.set_stream_id(1);
    fill(o);
    std::string prefix = {'\1', static_cast<char>(max_record >> 8),
                          static_cast<char>(max_record & 0xff)};
    out.push_back(prefix + pb(o));
  };
  open(0, [](v1::StreamOpen& o) {
    o.mutable_outgoing()->set_protocol(v1::OutgoingConnect::TCP);
    o.mutable_outgoing()->set_host("[::ffff:10.0.0.1]");
    o.mutable_outgoing()->set_port(443);
  });
  open(0, [](v1::StreamOpen& o) {
    o.mutable_outgoing()->set_protocol(v1::OutgoingConnect::UNIX_STREAM);
    o.mutable_outgoing()->set_unix_path("/var/run/../../abs/hosts");
  });
  open(0, [](v1::StreamOpen& o) {
    o.mutable_outgoing()->set_protocol(v1::OutgoingConnect::UNIX_SEQPACKET);
    o.mutable_outgoing()->set_unix_path("@abstract-name");
  });
  open(65000, [](v1::StreamOpen& o) {
    o.mutable_capture()->set_interface("eth0");
    o.mutable_capture()->set_filter("tcp port 80 and (host 10.0.0.1 or ip6)");
    o.mutable_capture()->set_snaplen(96);
  });
  open(100, [](v1::StreamOpen& o) { o.mutable_capture()->set_interface("../x"); });

  {
    using namespace std::string_literals;
    const std::string runtime = "PATH=/usr/bin\nHOME=/\nA\n=x";
    const std::string raw = "PATH=/bin\0HOME=/root\0=bad\0noequals\0A=b=c\0\xff\xfe=v\0X=\xc3\x28"s;
    out.push_back("\2"s + static_cast<char>(runtime.size()) + runtime + raw);
  }
  // A response for "a.example" A: a CNAME to b.example (compressed
  // names), then an A record of b.example.
  const std::vector<unsigned char> dns_bytes = {
      0x12, 0x34, 0x81, 0x80, 0,   1,   0,   2,   0,   0,   0, 0,              // header
      1,    'a',  7,    'e',  'x', 'a', 'm', 'p', 'l', 'e', 0, 0, 1,  0,   1,  // question @12
      0xc0, 12,   0,    5,    0,   1,   0,   0,   0,   60,  0, 4, 1,  'b', 0xc0, 14,  // CNAME @27
      0xc0, 39,   0,    1,    0,   1,   0,   0,   0,   30,  0, 4, 10, 0,   0,    7};  // A @43
  const std::string dns_msg(dns_bytes.begin(), dns_bytes.end());
  out.push_back(std::string("\3\0", 2) + dns_msg);
  out.push_back(std::string("\3\2", 2) + dns_msg.substr(0, 40));
  const std::string resolv =
      "nameserver 10.96.0.10\nnameserver fe80::1%eth0\nsearch default.svc.cluster.local "
      "svc.cluster.local cluster.local\noptions ndots:5 timeout:0 attempts:9 rotate\n";
  const std::string hosts = "10.0.0.5 db.internal db # primary\n::1 localhost\nbad line\n";
  for (std::string name : {"db", "kubernetes.default", "10.0.0.5"}) {
    std::string s = {'\4', static_cast<char>(name.size())};
    s += name;
    s += name == "10.0.0.5" ? '\1' : '\0';
    s += {static_cast<char>(resolv.size() >> 8), static_cast<char>(resolv.size() & 0xff)};
    out.push_back(s + resolv + hosts);
  }
  v1::SocketAddress peer;
  peer.set_ip("::ffff:192.0.2.1");
  peer.set_port(53);
  out.push_back("\5" + pb(peer));
  return out;
}

}  // namespace
}  // namespace siphon::agent

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  siphon::fuzz::writeSeedsIfAsked(siphon::agent::seeds());
  siphon::agent::makeFixture();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace siphon::agent;
  siphon::fuzz::Input in(std::string_view(reinterpret_cast<const char*>(data), size));
  switch (in.byte() % 6) {
    case 0:
      fuzzRequest(in.rest());
      break;
    case 1:
      fuzzStreamOpen(in);
      break;
    case 2:
      fuzzEnviron(in);
      break;
    case 3:
      fuzzDnsAnswer(in);
      break;
    case 4:
      fuzzDnsConfig(in);
      break;
    case 5:
      fuzzDatagramPeer(in.rest());
      break;
  }
  return 0;
}
