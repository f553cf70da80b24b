#include "agent/capture/capture_service.h"

#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <sys/socket.h>

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/capture/adopted_ring.h"
#include "agent/capture/capture_spec.h"
#include "agent/common/log.h"
#include "agent/netns/netns_worker.h"
#include "siphon/protocol/codec.h"
#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::agent::capture {
namespace {

namespace asio = net::asio;

using SourceOr = absl::StatusOr<std::unique_ptr<PacketSource>>;

class CaptureService : public StreamService {
 public:
  CaptureService(ServiceContext& ctx, CaptureOptions options)
      : ctx_(ctx),
        options_(std::move(options)),
        compiler_(std::make_shared<FilterCompiler>(options_.compile_filter,
                                                   options_.filter_compile_deadline,
                                                   options_.max_filter_compiles)),
        active_(std::make_shared<size_t>(0)) {}

  void open(std::shared_ptr<SessionHost> session, v1::StreamOpen open) override {
    const uint64_t id = open.stream_id();
    const protocol::Session& s = session->session();
    auto refuse = [&](const absl::Status& why) {
      log::info("capture_refused",
                {{"session", session->id()}, {"stream", id}, {"error", sv(why.message())}});
      session->resetStream(id, toProtoError(why));
      session->wake();
    };
    if (draining_) {
      refuse(protoError(v1::AGENT_DRAINING,
                        "capture: the agent is shutting down; capture through another agent"));
      return;
    }
    if (*active_ >= options_.max_captures) {
      refuse(protoError(v1::RESOURCE_EXHAUSTED,
                        absl::StrCat("capture: ", options_.max_captures,
                                     " captures run on this agent already; end one first")));
      return;
    }
    // Each record goes as one Data frame: the snaplen must let it fit.
    auto spec =
        captureSpec(open.capture(), s.limits().max_frame_size - protocol::kDataFrameOverhead);
    if (!spec.ok()) {
      refuse(spec.status());
      return;
    }

    CaptureStream::Options so = options_.stream;
    so.session_id = session->id();
    so.interface = spec->interface;
    so.filter = spec->filter;
    // Twice the block timeout: the kernel's retire timer runs in jiffies and
    // is re-armed per period.
    so.finish_delay = std::chrono::milliseconds(2 * spec->block_timeout_ms + 10);
    ++*active_;
    so.on_end = [active = active_] { --*active; };
    HostRef host(session);
    auto stream =
        std::make_shared<CaptureStream>(ctx_.io.get_executor(), id, session, std::move(so));
    // Registered before the source is open, so a Reset or the session's end
    // meanwhile ends it (the source is closed as soon as it arrives).
    session->registerStream(id, stream);
    std::erase_if(streams_, [](const std::weak_ptr<CaptureStream>& w) {
      auto s = w.lock();
      return !s || s->dead();
    });
    streams_.push_back(stream);
    log::debug("capture_open", {{"session", session->id()},
                                {"stream", id},
                                {"interface", spec->interface},
                                {"filter", spec->filter.substr(0, 200)},
                                {"snaplen", spec->snaplen}});
    // An exception escaping the open ends this capture only.
    std::weak_ptr<CaptureStream> weak = stream;
    net::spawn(ctx_.io,
               openSource(ctx_.netns, options_.open_source, compiler_, std::move(host),
                          std::move(stream), *std::move(spec)),
               "capture_open", [weak] {
                 auto s = weak.lock();
                 if (s && !s->dead()) {
                   s->reset(toProtoError(protoError(v1::INTERNAL, "capture open failed")));
                 }
               });
  }

 private:
  // Opens the source inside the target's netns, compiles the filter off
  // the NetnsWorker and installs it, then accepts the stream and starts the
  // capture, or resets it with the reason.
  static net::awaitable<void> openSource(NetnsRunner& netns,
                                         std::function<SourceOr(const CaptureSpec&)> opener_in,
                                         std::shared_ptr<FilterCompiler> compiler_in,
                                         HostRef host_in, std::shared_ptr<CaptureStream> stream_in,
                                         CaptureSpec spec_in) {
    // GCC 12 drops by-value coroutine parameters the body never names.
    const auto opener = std::move(opener_in);
    const auto compiler = std::move(compiler_in);
    const auto host = std::move(host_in);
    const auto stream = std::move(stream_in);
    const CaptureSpec spec = std::move(spec_in);
    try {
      // A named function object: GCC 12 destroys temporaries in a co_await
      // expression twice.
      std::function<SourceOr()> task = [opener, spec] { return opener(spec); };
      SourceOr source = co_await netns.runAsync(task);
      if (stream->dead()) co_return;  // the client or the session gave up meanwhile
      auto refused = [&](const absl::Status& why) {
        log::info("capture_refused", {{"stream", stream->streamId()},
                                      {"interface", spec.interface},
                                      {"filter", spec.filter.substr(0, 200)},
                                      {"error", sv(why.message())}});
        stream->reset(toProtoError(why));
      };
      if (!source.ok()) {
        refused(source.status());
        co_return;
      }
      if (!spec.filter.empty()) {
        // Not on the NetnsWorker: libpcap's compiler has no time limit, and
        // every netns operation of the agent waits behind that thread.
        // Built outside the co_await: GCC 12 destroys temporaries in a
        // co_await expression twice.
        net::awaitable<CompiledFilterOr> compiling =
            compiler->compile(spec.filter, (*source)->dataLink(), (*source)->snaplen());
        CompiledFilterOr filter = co_await std::move(compiling);
        if (stream->dead()) co_return;
        absl::Status set = filter.ok() ? (*source)->setFilter(**filter) : filter.status();
        if (!set.ok()) {
          refused(set);
          co_return;
        }
      }
      protocol::Session* s = host.session();
      if (s == nullptr) {
        stream->close();
        co_return;
      }
      v1::StreamAccept accept;
      accept.set_stream_id(stream->streamId());
      if (!s->acceptStream(std::move(accept)).ok()) {
        // The client reset it meanwhile.
        host.release(stream->streamId());
        stream->close();
        co_return;
      }
      // Its buffer is its credit (a packet without room is dropped, a
      // gap): a burst must not meet the session's smaller unsent bound.
      s->unboundUnsent(stream->streamId());
      host.wake();
      stream->start(*std::move(source));
    } catch (const std::exception& e) {
      stream->reset(
          toProtoError(protoError(v1::INTERNAL, absl::StrCat("capture open: ", e.what()))));
    }
  }

  // A capture holds nothing the target needs: a drain ends it at once
  // (the pcap written so far stays valid) instead of waiting for it.
  void agentDraining() override {
    draining_ = true;
    const v1::Error error =
        toProtoError(protoError(v1::AGENT_DRAINING, "capture stopped: the agent is shutting down"));
    for (auto& w : streams_) {
      if (auto s = w.lock(); s && !s->dead()) s->reset(error);
    }
    streams_.clear();
  }

  // Captures move (CaptureStream, "handover"); one opening or finishing
  // is waited for.
  std::string handoverBlocker() const override {
    for (const auto& w : streams_) {
      auto s = w.lock();
      if (!s) continue;
      if (std::string why = s->handoverBlocker(); !why.empty()) return why;
    }
    return "";
  }

  // The old agent's captures: each packet socket adopted with its ring
  // (adopted_ring.h: libpcap cannot take an open one), its stream as it
  // stood; reading starts in startAfterHandover().
  absl::Status importState(
      const v1::AgentState& in, std::vector<UniqueFd>& fds,
      const std::map<std::string, std::shared_ptr<SessionHost>>& sessions) override {
    for (const v1::SessionExport& e : in.sessions()) {
      for (const v1::PumpExport& p : e.pumps()) {
        if (p.service() != "capture") continue;
        RETURN_IF_ERROR(importOne(e.id(), p, fds, sessions));
      }
    }
    return absl::OkStatus();
  }

  void startAfterHandover() override {
    for (auto& s : imported_) s->resume();
    imported_.clear();
  }

  // `status` with `what` in front, its error code kept.
  static absl::Status withWhat(const std::string& what, const absl::Status& status) {
    return protoError(errorCodeOf(status), absl::StrCat(what, ": ", status.message()));
  }

  absl::Status importOne(const std::string& session_id, const v1::PumpExport& p,
                         std::vector<UniqueFd>& fds,
                         const std::map<std::string, std::shared_ptr<SessionHost>>& sessions) {
    const v1::CaptureStreamExport& c = p.capture();
    const std::string what = absl::StrCat("capture stream ", p.stream_id());
    auto host = sessions.find(session_id);
    if (host == sessions.end()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": its session did not come"));
    }
    if (c.socket() < 0 || static_cast<size_t>(c.socket()) >= fds.size() ||
        !fds[static_cast<size_t>(c.socket())]) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": its packet socket is missing"));
    }
    if (!host->second->session().streamOpen(p.stream_id())) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": not open in its session"));
    }
    AdoptedRing ring;
    ring.socket = std::move(fds[static_cast<size_t>(c.socket())]);
    // packet_diag answers for the netns of the asking socket: the target's.
    auto diag = ctx_.netns.socketSync(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (!diag.ok()) return diag.status();
    auto geometry = ringGeometry(diag->get(), ring.socket.get());
    if (!geometry.ok()) return withWhat(what, geometry.status());
    ring.geometry = *geometry;
    ring.link_type = c.link_type();
    ring.snaplen = c.snaplen();
    ring.data_link = c.data_link();
    ring.kernel_drops = c.kernel_drops();
    auto source = adoptRing(std::move(ring));
    if (!source.ok()) return withWhat(what, source.status());
    CaptureStream::Options so = options_.stream;
    so.session_id = session_id;
    so.interface = c.interface();
    so.filter = c.filter();
    so.finish_delay = std::chrono::milliseconds(c.finish_delay_ms());
    ++*active_;
    so.on_end = [active = active_] { --*active; };
    auto stream = std::make_shared<CaptureStream>(ctx_.io.get_executor(), p.stream_id(),
                                                  host->second, std::move(so));
    stream->restoreFrom(c);
    RETURN_IF_ERROR(stream->adopt(*std::move(source)));
    host->second->registerStream(p.stream_id(), stream);
    streams_.push_back(stream);
    imported_.push_back(std::move(stream));
    return absl::OkStatus();
  }

  ServiceContext& ctx_;
  CaptureOptions options_;
  std::shared_ptr<FilterCompiler> compiler_;  // shared with the opens under way
  bool draining_ = false;
  std::vector<std::weak_ptr<CaptureStream>> streams_;  // the open ones (dead ones pruned)
  // Adopted in a handover, until the agent serves.
  std::vector<std::shared_ptr<CaptureStream>> imported_;
  // Captures running now; shared with their on_end, which may outlive us.
  std::shared_ptr<size_t> active_;
};

}  // namespace

std::shared_ptr<StreamService> makeCaptureService(ServiceContext& ctx, CaptureOptions options) {
  return std::make_shared<CaptureService>(ctx, std::move(options));
}

void registerCapture(ServiceRegistry& registry, ServiceContext& ctx) {
  registry.addStream(v1::StreamOpen::kCapture, makeCaptureService(ctx));
  registry.addFeature(v1::FEATURE_CAPTURE);
}

}  // namespace siphon::agent::capture
