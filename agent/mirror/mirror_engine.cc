#include "agent/mirror/mirror_engine.h"

#include <fcntl.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netlink/msg.h>
#include <netlink/netlink.h>
#include <netlink/socket.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "agent/common/unique_fd.h"
#include "agent/mirror/redirected_hops.h"
#include "agent/netns/netns_thread.h"
#include "loader/mirror_loader.h"
#include "siphon/status.h"
#include "siphon/v1/streams.pb.h"

namespace siphon::agent::mirror {
namespace {

// A handover's overlap: the new engine's program copied into its ring
// while the old one still copied into the old ring. A packet copied by both
// is stamped by the old program first, then by the new one a few
// microseconds later (both run on the same hook, one after the other).
constexpr Timestamp kOverlapSlack = std::chrono::milliseconds(1);

Timestamp monotonicNow() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

struct NlSockDeleter {
  void operator()(nl_sock* s) const { nl_socket_free(s); }
};
using NlSock = std::unique_ptr<nl_sock, NlSockDeleter>;

}  // namespace

uint8_t directionByte(Direction direction) {
  return static_cast<uint8_t>(direction == Direction::kClientToServer ? v1::CLIENT_TO_SERVER
                                                                      : v1::SERVER_TO_CLIENT);
}

struct MirrorEngine::Impl : ConnectionEvents {
  MirrorEngineOptions options;
  Deliver deliver;
  std::unique_ptr<bpf::MirrorLoader> loader;
  NlSock links;   // rtnetlink link events of the target's netns
  UniqueFd wake;  // eventfd: ports changed, or stop
  UniqueFd epoll;
  NetnsThread thread;  // the engine's: inside the target's netns
  std::atomic<bool> stop{false};
  std::atomic<size_t> queued{0};

  // Guarded by mu: what other threads change or read.
  mutable std::mutex mu;
  std::set<uint16_t> ports;
  std::set<uint16_t> unwanted_s2c;  // setServerToClient(port, false)
  bool ports_changed = false;
  MirrorEngineStats stats;

  // Engine thread only.
  std::unique_ptr<ConnectionTable> table;
  // A meshed connection's mesh-facing hop left out (redirected_hops.h).
  std::unique_ptr<RedirectedHops> hops;
  std::set<int> loopbacks;  // ifindexes of attached loopback interfaces
  std::vector<MirrorEvent> batch;
  // Ports whose server->client bytes nobody wants, and each open
  // connection's server port (to look it up).
  std::set<uint16_t> skip_s2c;
  std::unordered_map<uint64_t, uint16_t> server_port;
  std::map<int, std::string> attached;  // ifindex -> name
  uint64_t overflow_gap_bytes = 0;
  absl::Status first_attach_error;  // of the start-up enumeration

  // Pause (pause(), resume(), exportState()). While `parked`, the thread
  // waits on pause_cv and touches nothing: the table is read under pause_mu
  // by exportState().
  std::mutex pause_mu;
  std::condition_variable pause_cv;
  bool pause_wanted = false;
  bool parked = false;
  bool finished = false;                 // run() returned
  std::atomic<bool> pause_asked{false};  // pause_wanted, read without the lock

  // Handover, the taking-over side (options.adopted). Engine thread, but
  // `reading` also under pause_mu (exportState() refuses before go()).
  std::atomic<bool> go_wanted{false};
  bool reading = true;            // false from an adopted start until go()
  bool draining_adopted = false;  // inside consumeAdopted()
  Timestamp adopted_last{};       // the newest stamp read from the old ring
  // While the old ring is read: the endpoints of the connections that were
  // open at the pause or opened since, by id; and of those that closed
  // meanwhile. The own ring then holds copies of their last packets too,
  // which would open each of them again as a new connection: they are
  // dropped while they are from the overlap.
  std::unordered_map<uint64_t, std::pair<Endpoint, Endpoint>> handover_endpoints;
  std::set<std::pair<Endpoint, Endpoint>> closed_in_handover;

  // ---- ConnectionEvents (engine thread, inside table calls) ----

  void onOpened(const ConnectionInfo& connection) override {
    MirrorEvent e;
    e.kind = MirrorEvent::Kind::kOpened;
    e.connection = connection.id;
    e.info = connection;
    batch.push_back(std::move(e));
    server_port[connection.id] = connection.server.port;
    if (draining_adopted) {
      handover_endpoints[connection.id] = {connection.client, connection.server};
    }
  }

  void onData(uint64_t id, Direction direction, std::string_view bytes) override {
    if (direction == Direction::kServerToClient && !skip_s2c.empty()) {
      auto it = server_port.find(id);
      if (it != server_port.end() && skip_s2c.contains(it->second)) {
        addGap(id, direction, bytes.size());  // no copy; merged with the last one
        return;
      }
    }
    while (!bytes.empty()) {
      const size_t n = std::min(bytes.size(), options.max_record);
      if (queued.load(std::memory_order_relaxed) + n + 1 > options.max_queued_bytes) {
        // The consumer is behind: these bytes are lost for everyone, and
        // said so; nothing waits.
        overflow_gap_bytes += n;
        addGap(id, direction, n);
      } else {
        MirrorEvent e;
        e.kind = MirrorEvent::Kind::kData;
        e.connection = id;
        e.direction = direction;
        e.record.reserve(n + 1);
        e.record.push_back(static_cast<char>(directionByte(direction)));
        e.record.append(bytes.substr(0, n));
        queued.fetch_add(e.record.size(), std::memory_order_relaxed);
        batch.push_back(std::move(e));
      }
      bytes.remove_prefix(n);
    }
  }

  void onGap(uint64_t id, Direction direction, uint64_t bytes) override {
    addGap(id, direction, bytes);
  }

  void onEnd(uint64_t id, Direction direction) override {
    MirrorEvent e;
    e.kind = MirrorEvent::Kind::kEnd;
    e.connection = id;
    e.direction = direction;
    batch.push_back(std::move(e));
  }

  void onClosed(uint64_t id, CloseReason reason) override {
    server_port.erase(id);
    if (draining_adopted) {
      if (auto it = handover_endpoints.find(id); it != handover_endpoints.end()) {
        closed_in_handover.insert(it->second);
        handover_endpoints.erase(it);
      }
    }
    MirrorEvent e;
    e.kind = MirrorEvent::Kind::kClosed;
    e.connection = id;
    e.reason = reason;
    batch.push_back(std::move(e));
  }

  // Consecutive gaps of one direction are one gap.
  void addGap(uint64_t id, Direction direction, uint64_t bytes) {
    if (!batch.empty()) {
      MirrorEvent& last = batch.back();
      if (last.kind == MirrorEvent::Kind::kGap && last.connection == id &&
          last.direction == direction) {
        last.gap_bytes += bytes;
        return;
      }
    }
    MirrorEvent e;
    e.kind = MirrorEvent::Kind::kGap;
    e.connection = id;
    e.direction = direction;
    e.gap_bytes = bytes;
    batch.push_back(std::move(e));
  }

  // ---- interfaces ----

  void attachInterface(int ifindex, const std::string& name, unsigned flags) {
    if (attached.contains(ifindex)) return;
    const bool loopback = (flags & IFF_LOOPBACK) != 0;
    absl::Status s = loader->attach(ifindex, loopback ? bpf::MirrorLoader::Hooks::kIngressOnly
                                                      : bpf::MirrorLoader::Hooks::kBoth);
    if (!s.ok() && !absl::IsAlreadyExists(s)) {
      log::warn("mirror_attach_failed", {{"interface", name},
                                         {"ifindex", static_cast<int64_t>(ifindex)},
                                         {"error", sv(s.message())}});
      if (first_attach_error.ok()) first_attach_error = s;
      return;
    }
    attached[ifindex] = name;
    if (loopback) loopbacks.insert(ifindex);
    log::info("mirror_attached", {{"interface", name},
                                  {"ifindex", static_cast<int64_t>(ifindex)},
                                  {"hooks", loopback ? "ingress" : "ingress,egress"}});
  }

  void detachInterface(int ifindex) {
    auto it = attached.find(ifindex);
    if (it == attached.end()) return;
    (void)loader->detach(ifindex);
    loopbacks.erase(ifindex);
    log::info("mirror_detached",
              {{"interface", it->second}, {"ifindex", static_cast<int64_t>(ifindex)}});
    attached.erase(it);
  }

  static int onLinkMessage(nl_msg* msg, void* arg) {
    auto* self = static_cast<Impl*>(arg);
    nlmsghdr* h = nlmsg_hdr(msg);
    if (h->nlmsg_type != RTM_NEWLINK && h->nlmsg_type != RTM_DELLINK) return NL_OK;
    if (h->nlmsg_len < NLMSG_LENGTH(sizeof(ifinfomsg))) return NL_OK;
    const auto* ifi = static_cast<const ifinfomsg*>(nlmsg_data(h));
    std::string name = absl::StrCat("if", ifi->ifi_index);
    if (nlattr* a = nlmsg_find_attr(h, sizeof(ifinfomsg), IFLA_IFNAME); a != nullptr) {
      const char* text = static_cast<const char*>(nla_data(a));
      name.assign(text, strnlen(text, static_cast<size_t>(nla_len(a))));
    }
    if (h->nlmsg_type == RTM_NEWLINK) {
      self->attachInterface(ifi->ifi_index, name, ifi->ifi_flags);
    } else {
      self->detachInterface(ifi->ifi_index);
    }
    return NL_OK;
  }

  absl::Status openLinkWatch() {
    links.reset(nl_socket_alloc());
    if (!links) return absl::ResourceExhaustedError("mirror: nl_socket_alloc failed");
    nl_socket_disable_seq_check(links.get());
    nl_socket_modify_cb(links.get(), NL_CB_VALID, NL_CB_CUSTOM, &Impl::onLinkMessage, this);
    if (int err = nl_connect(links.get(), NETLINK_ROUTE); err < 0) {
      return absl::UnavailableError(absl::StrCat("mirror: rtnetlink connect: ", nl_geterror(err)));
    }
    // Joined before the dump: a link that appears meanwhile is in one or the other.
    if (int err = nl_socket_add_membership(links.get(), RTNLGRP_LINK); err < 0) {
      return absl::UnavailableError(
          absl::StrCat("mirror: rtnetlink link events: ", nl_geterror(err)));
    }
    ifinfomsg request{};
    request.ifi_family = AF_UNSPEC;
    if (int err = nl_send_simple(links.get(), RTM_GETLINK, NLM_F_DUMP, &request, sizeof(request));
        err < 0) {
      return absl::UnavailableError(absl::StrCat("mirror: list interfaces: ", nl_geterror(err)));
    }
    // Blocking until the dump's NLMSG_DONE: every interface there now.
    if (int err = nl_recvmsgs_default(links.get()); err < 0) {
      return absl::UnavailableError(absl::StrCat("mirror: list interfaces: ", nl_geterror(err)));
    }
    nl_socket_set_nonblocking(links.get());
    return absl::OkStatus();
  }

  // ---- the thread ----

  // On the engine's thread, inside the target's netns.
  absl::Status setUp() {
    bpf::MirrorLoader::Options lo;
    lo.ring_bytes = options.ring_bytes;
    auto loaded = bpf::MirrorLoader::load(lo);
    if (!loaded.ok()) {
      return absl::Status(
          loaded.status().code(),
          absl::StrCat("mirror: load the TC capture program: ", loaded.status().message()));
    }
    loader = std::move(*loaded);
    // Made here: its conntrack socket must be of the target's netns.
    hops = std::make_unique<RedirectedHops>(makeKernelNatLookup());
    RETURN_IF_ERROR(loader->startReader(
        [this](const bpf::MirrorPacket& p) {
          std::string_view bytes(reinterpret_cast<const char*>(p.data.data()), p.data.size());
          const Timestamp at(static_cast<int64_t>(p.header.timestamp_ns));
          if (draining_adopted) {
            adopted_last = std::max(adopted_last, at);
          } else if (!closed_in_handover.empty() && at <= adopted_last + kOverlapSlack &&
                     ofClosedInHandover(bytes)) {
            return;  // read from the old ring already, and closed there
          }
          hops->onPacket(bytes, loopbacks.contains(static_cast<int>(p.header.ifindex)), at,
                         [this, at](std::string_view packet) {
                           // A malformed packet is counted by the table.
                           (void)table->onPacket(packet, LinkType::kRawIp, at);
                         });
        },
        [this](uint64_t lost) { table->addDroppedPackets(lost); }));
    if (options.adopted) RETURN_IF_ERROR(adopt(*options.adopted));
    RETURN_IF_ERROR(openLinkWatch());
    if (attached.empty()) {
      return first_attach_error.ok()
                 ? absl::NotFoundError("mirror: no network interface in the target's namespace")
                 : first_attach_error;
    }
    wake = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake) return lastErrnoStatus("mirror: eventfd");
    epoll = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll) return lastErrnoStatus("mirror: epoll_create1");
    // The ring is level-triggered: it joins the epoll set only once read.
    if (reading) RETURN_IF_ERROR(watch(loader->fd()));
    RETURN_IF_ERROR(watch(nl_socket_get_fd(links.get())));
    RETURN_IF_ERROR(watch(wake.get()));
    return absl::OkStatus();
  }

  absl::Status watch(int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      return lastErrnoStatus("mirror: epoll_ctl");
    }
    return absl::OkStatus();
  }

  // In setUp(), before the interfaces are attached: the ports the old
  // engine mirrored are copied into the new ring from the first attached
  // interface on, the connections restored.
  absl::Status adopt(const MirrorEngineState& state) {
    std::set<uint16_t> mirrored = options.table.server_ports;
    mirrored.insert(state.ports.begin(), state.ports.end());
    for (uint16_t port : mirrored) RETURN_IF_ERROR(loader->addPort(port));
    hops->setPorts(mirrored);
    table->setServerPorts(mirrored);  // the table is empty yet: closes nothing
    skip_s2c = state.ports_without_server_bytes;
    {
      std::lock_guard lock(mu);
      ports = std::move(mirrored);
      unwanted_s2c = state.ports_without_server_bytes;
    }
    RETURN_IF_ERROR(loader->adoptRing(state.ring.get()));
    table->restore(state.connections, state.next_connection_id, monotonicNow());
    for (const ConnectionSnapshot& c : state.connections) {
      server_port[c.info.id] = c.info.server.port;
      handover_endpoints[c.info.id] = {c.info.client, c.info.server};
    }
    std::lock_guard lock(pause_mu);
    reading = false;
    return absl::OkStatus();
  }

  // go(): the old process is gone, so its ring gets nothing more. Read it
  // to its end (the same callback: each packet goes to hops and the table
  // as if read from our ring), then our own from the next consume on.
  void takeOver() {
    draining_adopted = true;
    auto read = loader->consumeAdopted();
    draining_adopted = false;
    if (!read.ok()) {
      // What was left in it becomes gaps (holes no ring fills).
      log::error("mirror_adopted_ring", {{"error", sv(read.status().message())}});
    }
    loader->closeAdopted();
    options.adopted.reset();  // its fd closed here, unless the caller holds the state
    handover_endpoints.clear();
    if (absl::Status s = watch(loader->fd()); !s.ok()) {
      log::error("mirror_stopped", {{"error", sv(s.message())}});
      stop.store(true);
    }
    std::lock_guard lock(pause_mu);
    reading = true;
    log::info("mirror_adopted_ring_read",
              {{"packets", static_cast<int64_t>(read.ok() ? *read : 0)},
               {"connections_closed_meanwhile", static_cast<int64_t>(closed_in_handover.size())}});
  }

  // Whether a packet of the own ring is of a connection closed while the
  // old ring was read (and so already complete).
  bool ofClosedInHandover(std::string_view packet) const {
    auto segment = parsePacket(packet, LinkType::kRawIp);
    if (!segment.ok()) return false;
    return closed_in_handover.contains({segment->source, segment->destination}) ||
           closed_in_handover.contains({segment->destination, segment->source});
  }

  // pause(): waits, delivering nothing, until resume() or the destructor.
  // False when it was the destructor.
  bool park() {
    flush();
    std::unique_lock lock(pause_mu);
    parked = true;
    pause_cv.notify_all();
    pause_cv.wait(lock, [this] { return !pause_wanted || stop.load(); });
    parked = false;
    return !stop.load();
  }

  void applyPorts() {
    std::set<uint16_t> now;
    {
      std::lock_guard lock(mu);
      if (!ports_changed) return;
      ports_changed = false;
      now = ports;
      skip_s2c = unwanted_s2c;
    }
    hops->setPorts(now);
    table->setServerPorts(std::move(now));
  }

  void flush() {
    if (batch.empty()) return;
    std::vector<MirrorEvent> out;
    out.swap(batch);
    deliver(std::move(out));
  }

  void publishStats() {
    auto kernel = loader->counters();
    std::lock_guard lock(mu);
    if (kernel.ok()) {
      stats.kernel_seen = kernel->seen;
      stats.kernel_copied = kernel->copied;
      stats.kernel_lost = kernel->failed;
    }
    stats.table = table->counters();
    stats.overflow_gap_bytes = overflow_gap_bytes;
    stats.connections_left_out = hops->counters().connections_left_out;
    stats.interfaces.clear();
    for (const auto& [ifindex, name] : attached) {
      stats.interfaces.push_back(absl::StrCat(name, "(", ifindex, ")"));
    }
  }

  void run() {
    bool abandoned = false;  // destroyed while paused
    Timestamp last_tick = monotonicNow();
    epoll_event events[4];
    while (!stop.load()) {
      // Between two iterations: everything read so far was delivered.
      if (pause_asked.load() && !park()) {
        abandoned = true;
        break;
      }
      int n = ::epoll_wait(epoll.get(), events, 4, static_cast<int>(options.tick.count()));
      if (n < 0 && errno != EINTR) {
        log::error("mirror_stopped", {{"error", sv(lastErrnoStatus("epoll_wait").message())}});
        break;
      }
      bool ring_ready = false;
      for (int i = 0; i < n; ++i) {
        if (events[i].data.fd == loader->fd()) {
          ring_ready = true;
        } else if (events[i].data.fd == wake.get()) {
          uint64_t v;
          (void)!::read(wake.get(), &v, sizeof(v));
        } else if (links && events[i].data.fd == nl_socket_get_fd(links.get())) {
          int err = nl_recvmsgs_default(links.get());
          if (err < 0 && err != -NLE_AGAIN) {
            // ENOBUFS: events were lost; the interfaces are listed again.
            log::warn("mirror_link_events", {{"error", nl_geterror(err)}});
            ifinfomsg request{};
            request.ifi_family = AF_UNSPEC;
            (void)nl_send_simple(links.get(), RTM_GETLINK, NLM_F_DUMP, &request, sizeof(request));
          }
        }
      }
      if (!reading) {
        if (!go_wanted.load()) {
          // Nothing read, so no timeout either: a restored hole may be
          // filled from one of the rings once they are read.
          if (monotonicNow() - last_tick >= options.tick) {
            publishStats();
            last_tick = monotonicNow();
          }
          continue;
        }
        takeOver();  // and on to our ring at once
      }
      if (ring_ready && options.coalesce.count() > 0) {
        // One wake-up per burst, not per packet (options.coalesce).
        timespec pause{0, static_cast<long>(options.coalesce.count()) * 1000};
        while (::nanosleep(&pause, &pause) != 0 && errno == EINTR) {
        }
      }
      applyPorts();
      const Timestamp read_at = monotonicNow();
      auto consumed = loader->consume();
      if (!consumed.ok()) {
        log::error("mirror_stopped", {{"error", sv(consumed.status().message())}});
        break;
      }
      if (!closed_in_handover.empty() && read_at > adopted_last + std::chrono::seconds(1)) {
        // Everything stamped in the overlap was in the ring by then (a
        // record is stamped once reserved, committed microseconds later).
        closed_in_handover.clear();
      }
      const Timestamp now = monotonicNow();
      if (now - last_tick >= options.tick) {
        hops->advanceTime(now, [this, now](std::string_view packet) {
          (void)table->onPacket(packet, LinkType::kRawIp, now);
        });
        table->advanceTime(now);
        publishStats();
        last_tick = now;
      }
      flush();
    }
    if (!abandoned) {
      table->closeAll();
      flush();
    }
    publishStats();
    std::lock_guard lock(pause_mu);
    finished = true;
    pause_cv.notify_all();
  }
};

absl::StatusOr<std::unique_ptr<MirrorEngine>> MirrorEngine::start(int netns_fd,
                                                                  MirrorEngineOptions options,
                                                                  Deliver deliver) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->deliver = std::move(deliver);
  impl->table = std::make_unique<ConnectionTable>(impl->options.table, *impl);
  Impl* raw = impl.get();
  ASSIGN_OR_RETURN(impl->thread, NetnsThread::start(
                                     netns_fd, "mirror", [raw] { return raw->setUp(); },
                                     [raw] {
                                       raw->publishStats();
                                       raw->run();
                                     }));
  return std::unique_ptr<MirrorEngine>(new MirrorEngine(std::move(impl)));
}

MirrorEngine::MirrorEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MirrorEngine::~MirrorEngine() {
  {
    // Under the lock: a parked thread checks `stop` under it too.
    std::lock_guard lock(impl_->pause_mu);
    impl_->stop.store(true);
  }
  impl_->pause_cv.notify_all();
  uint64_t one = 1;
  (void)!::write(impl_->wake.get(), &one, sizeof(one));
  impl_->thread.join();
  // Every loss the copy had, in one line (the sessions got each as a gap).
  const MirrorEngineStats st = stats();
  log::info("mirror_capture_stopped", {{"packets_seen", st.kernel_seen},
                                       {"packets_copied", st.kernel_copied},
                                       {"packets_lost_ring_full", st.kernel_lost},
                                       {"packets_invalid", st.table.invalid_packets},
                                       {"connections", st.table.connections_opened},
                                       {"bytes", st.table.delivered_bytes},
                                       {"gap_bytes", st.table.gap_bytes},
                                       {"gap_bytes_consumer_behind", st.overflow_gap_bytes},
                                       {"mesh_hops_left_out", st.connections_left_out}});
  // The loader's destructor closes the TCX links: detached everywhere.
}

absl::Status MirrorEngine::addPort(uint16_t port) {
  if (port == 0) return absl::InvalidArgumentError("mirror: port must be 1 to 65535");
  {
    std::lock_guard lock(impl_->mu);
    impl_->ports.insert(port);
    impl_->ports_changed = true;
  }
  uint64_t one = 1;
  (void)!::write(impl_->wake.get(), &one, sizeof(one));
  // The map is the kernel's: safe from any thread.
  return impl_->loader->addPort(port);
}

absl::Status MirrorEngine::removePort(uint16_t port) {
  absl::Status s = impl_->loader->removePort(port);
  {
    std::lock_guard lock(impl_->mu);
    impl_->ports.erase(port);
    impl_->unwanted_s2c.erase(port);
    impl_->ports_changed = true;
  }
  uint64_t one = 1;
  (void)!::write(impl_->wake.get(), &one, sizeof(one));
  return s;
}

void MirrorEngine::setServerToClient(uint16_t port, bool wanted) {
  {
    std::lock_guard lock(impl_->mu);
    if (wanted ? impl_->unwanted_s2c.erase(port) == 0 : !impl_->unwanted_s2c.insert(port).second) {
      return;  // no change
    }
    impl_->ports_changed = true;
  }
  uint64_t one = 1;
  (void)!::write(impl_->wake.get(), &one, sizeof(one));
}

void MirrorEngine::released(size_t bytes) {
  impl_->queued.fetch_sub(bytes, std::memory_order_relaxed);
}

size_t MirrorEngine::queuedBytes() const { return impl_->queued.load(); }

void MirrorEngine::pause() {
  std::unique_lock lock(impl_->pause_mu);
  impl_->pause_wanted = true;
  impl_->pause_asked.store(true);
  uint64_t one = 1;
  (void)!::write(impl_->wake.get(), &one, sizeof(one));
  impl_->pause_cv.wait(lock,
                       [this] { return impl_->parked || impl_->finished || !impl_->pause_wanted; });
}

void MirrorEngine::resume() {
  {
    std::lock_guard lock(impl_->pause_mu);
    impl_->pause_wanted = false;
    impl_->pause_asked.store(false);
  }
  impl_->pause_cv.notify_all();
}

absl::StatusOr<MirrorEngineState> MirrorEngine::exportState() {
  std::lock_guard lock(impl_->pause_mu);
  if (!impl_->parked) {
    return absl::FailedPreconditionError(
        "mirror: the engine's state is exported only while paused");
  }
  if (!impl_->reading) {
    return absl::FailedPreconditionError(
        "mirror: the engine took over a ring it has not read yet (go() not called)");
  }
  MirrorEngineState state;
  state.connections = impl_->table->snapshot();
  state.next_connection_id = impl_->table->nextId();
  {
    std::lock_guard ports_lock(impl_->mu);
    state.ports = impl_->ports;
    state.ports_without_server_bytes = impl_->unwanted_s2c;
  }
  state.ring = UniqueFd(::fcntl(impl_->loader->ringFd(), F_DUPFD_CLOEXEC, 0));
  if (!state.ring) return lastErrnoStatus("mirror: dup the ring buffer's fd");
  return state;
}

void MirrorEngine::go() {
  if (impl_->go_wanted.exchange(true)) return;
  uint64_t one = 1;
  (void)!::write(impl_->wake.get(), &one, sizeof(one));
}

MirrorEngineStats MirrorEngine::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

}  // namespace siphon::agent::mirror
