// Calls: unary requests and stream opens on the current Link, this client's
// numbers for file handles and subscriptions (mapped per Link), and what a
// Link's session hands on about them (answers, opens, notices, draining).
#include <errno.h>
#include <fcntl.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/link.h"
#include "siphon/status.h"

namespace siphon::client {

using net::asio::steady_timer;

namespace {

// The file or directory handle a file request names, with the operation's
// name (for errors), or nullopt; and the same field set.
#define SIPHON_HANDLE_OPS(X)                                                             \
  X(kRead, read, fd) X(kPread, pread, fd) X(kWrite, write, fd) X(kPwrite, pwrite, fd)    \
  X(kSeek, seek, fd) X(kClose, close, fd) X(kFstat, fstat, fd) X(kFtruncate, ftruncate, fd) \
  X(kReaddir, readdir, dir) X(kClosedir, closedir, dir)

std::optional<uint64_t> handleOf(const v1::FileRequest& f, std::string_view* op) {
  switch (f.op_case()) {
#define X(kCase, name, field) \
  case v1::FileRequest::kCase: \
    *op = #name;               \
    return f.name().field();
    SIPHON_HANDLE_OPS(X)
#undef X
    default:
      return std::nullopt;
  }
}

void setHandle(v1::FileRequest& f, uint64_t value) {
  switch (f.op_case()) {
#define X(kCase, name, field)             \
  case v1::FileRequest::kCase:            \
    f.mutable_##name()->set_##field(value); \
    return;
    SIPHON_HANDLE_OPS(X)
#undef X
    default:
      return;
  }
}
#undef SIPHON_HANDLE_OPS

bool opensHandle(const v1::Request& r) {
  return r.has_file() && (r.file().has_open() || r.file().has_opendir());
}
bool closesHandle(const v1::Request& r) {
  return r.has_file() && (r.file().has_close() || r.file().has_closedir());
}
bool subscribes(const v1::Request& r) { return r.has_steal() || r.has_mirror(); }

// The client's number for an agent's handle or subscription id: the agent's
// own on the first session (so logs on both sides agree), a number above
// every one handed out so far on later ones.
template <typename Map>
uint64_t clientId(const Map& used, uint64_t agent_id, uint64_t generation, uint64_t* next) {
  if (generation == 1 && used.count(agent_id) == 0) {
    *next = std::max(*next, agent_id);
    return agent_id;
  }
  do {
    ++*next;
  } while (used.count(*next) != 0);
  return *next;
}

}  // namespace

std::shared_ptr<Link> Client::linkOf(uint64_t generation) const {
  if (link_ && link_->generation == generation) return link_;
  for (const auto& weak : retiring_) {
    auto l = weak.lock();
    if (l && l->generation == generation) return l;
  }
  for (const auto& l : replicas_) {
    if (l->generation == generation) return l;
  }
  return nullptr;
}

net::awaitable<absl::StatusOr<v1::Response>> Client::call(
    v1::Request request, std::chrono::milliseconds timeout,
    std::shared_ptr<protocol::PipedBytes>* piped) {
  if (!lost_.ok()) co_return lost_;
  if (!link_) co_return protoError(v1::FAILED_PRECONDITION, "not connected");
  const auto deadline = steady_timer::clock_type::now() + timeout;
  if (!co_await waitForMove(deadline)) {
    if (!lost_.ok()) co_return lost_;
    co_return protoError(v1::TIMEOUT, absl::StrCat("no agent to send request to within ",
                                                   timeout.count(), " ms: moving to another"));
  }
  std::shared_ptr<Link> link = link_;

  // Handles are this client's numbers: a handle of a lost session stays
  // invalid, and a handle goes to the session that opened it.
  std::optional<uint64_t> handle;
  if (request.has_file()) {
    std::string_view op;
    handle = handleOf(request.file(), &op);
    auto it = handle ? handles_.find(*handle) : handles_.end();
    if (it != handles_.end()) {
      link = linkOf(it->second.generation);
      const bool gone = !link || !link->lost.ok();
      if (options_.reopen_files && (gone || it->second.stale)) {
        if (closesHandle(request)) {
          // Nothing of it is open anywhere: closing it is done.
          handles_.erase(it);
          v1::Response done;
          done.mutable_file()->mutable_done();
          co_return done;
        }
        if (!it->second.path.empty()) {
          auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
              deadline - steady_timer::clock_type::now());
          CO_RETURN_IF_ERROR(co_await reopen(*handle, std::max(left, std::chrono::milliseconds(1))));
          it = handles_.find(*handle);
          link = link_;
        }
      }
      if (it == handles_.end()) co_return errnoStatus(EBADF, absl::StrCat(asv(op), " fd ", *handle));
      link = linkOf(it->second.generation);
      if (!link || !link->lost.ok()) {
        std::string where = it->second.endpoint;
        if (closesHandle(request)) handles_.erase(it);
        co_return errnoStatus(
            EBADF, absl::StrCat(asv(op), " fd ", *handle, " (opened on the agent at ", where,
                                ", whose session is lost; handles are never reopened behind "
                                "your back)"));
      }
      setHandle(*request.mutable_file(), it->second.agent_fd);
    } else if (handle && link->generation != 1) {
      co_return errnoStatus(EBADF, absl::StrCat(asv(op), " fd ", *handle));
    }
    // Else, on the first session, a handle this client did not hand out
    // goes as given: the agent judges it.
  }
  // Subscription ids, too, are this client's (the same rules). One held on
  // several agents (replicas) is ended on each: the answer is the first
  // live one's, the others' are not waited for.
  std::optional<uint64_t> unsubscribing;
  if (request.has_unsubscribe()) {
    const uint64_t id = request.unsubscribe().subscription_id();
    auto it = subscriptions_.find(id);
    if (it != subscriptions_.end()) {
      std::shared_ptr<Link> answering;
      for (const auto& [generation, agent_id] : it->second.agents) {
        auto l = linkOf(generation);
        if (!l || !l->lost.ok()) continue;
        if (!answering) {
          // Its streams that come before the answer are still its own.
          answering = l;
          unsubscribing = agent_id;
          request.mutable_unsubscribe()->set_subscription_id(agent_id);
          continue;
        }
        l->subscription_ids.erase(agent_id);
        v1::Request other;
        other.mutable_unsubscribe()->set_subscription_id(agent_id);
        if (l->session->sendRequest(std::move(other)).ok()) l->wake();
      }
      subscriptions_.erase(it);
      if (!answering) {
        // It did not come back after a failover: nothing holds it any more.
        v1::Response r;
        r.mutable_unsubscribed();
        co_return r;
      }
      link = answering;
    } else if (link->generation != 1) {
      co_return protoError(v1::NOT_FOUND, absl::StrCat("no subscription ", id, " in this client"));
    }
  }
  const bool opens = opensHandle(request);
  const bool closes = closesHandle(request);
  const bool subscribing = subscribes(request);
  // reopen_files: a read, write or seek moves the handle's offset.
  const bool moves_offset =
      options_.reopen_files && handle && request.has_file() &&
      (request.file().has_read() || request.file().has_write() || request.file().has_seek());
  std::string open_path;
  int32_t open_flags = 0;
  if (options_.reopen_files && request.has_file() && request.file().has_open()) {
    open_path = request.file().open().path();
    open_flags = request.file().open().flags();
  }
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - steady_timer::clock_type::now());
  auto response = co_await callOn(link, std::move(request),
                                  std::max(left, std::chrono::milliseconds(1)), 0, piped);
  if (closes) handles_.erase(*handle);
  if (moves_offset && response.ok()) {
    trackOffset(*handle, *response, piped != nullptr && *piped ? (*piped)->size() : 0);
  }
  // Forgotten whatever the agent answered: the program asked to stop.
  if (unsubscribing) link->subscription_ids.erase(*unsubscribing);
  // An opendir the agent answered whole and closed itself (closed: no
  // handle) takes no client id.
  if (opens && response.ok() && response->has_file() && response->file().has_opened() &&
      !response->file().opened().closed()) {
    const uint64_t agent_fd = response->file().opened().fd();
    const uint64_t h = clientId(handles_, agent_fd, link->generation, &next_handle_);
    Handle entry;
    entry.generation = link->generation;
    entry.agent_fd = agent_fd;
    entry.endpoint = link->endpoint;
    if (!open_path.empty()) {
      // What the file is now, to know it again on another agent.
      v1::Request fstat;
      fstat.mutable_file()->mutable_fstat()->set_fd(agent_fd);
      auto st = co_await callOn(link, std::move(fstat), options_.handshake_timeout, 0);
      if (st.ok() && st->has_file() && st->file().has_stat()) {
        entry.path = open_path;
        entry.flags = open_flags & ~(O_CREAT | O_EXCL | O_TRUNC);
        entry.identity = st->file().stat();
      }
    }
    handles_[h] = std::move(entry);
    response->mutable_file()->mutable_opened()->set_fd(h);
  }
  if (subscribing && response.ok() && response->has_subscribed() && !replicas_.empty()) {
    co_await fanOut(response->subscribed().subscription_id());
  }
  co_return response;
}

absl::Status Client::handleStatus(uint64_t handle) const {
  auto it = handles_.find(handle);
  if (it == handles_.end()) return errnoStatus(EBADF, absl::StrCat("fd ", handle, " is not open"));
  auto link = linkOf(it->second.generation);
  if (!link || !link->lost.ok()) {
    return errnoStatus(EBADF, absl::StrCat("fd ", handle, " (opened on the agent at ",
                                           it->second.endpoint,
                                           ", whose session is lost; handles are never reopened "
                                           "behind your back)"));
  }
  return absl::OkStatus();
}

void Client::closeHandleNoWait(uint64_t handle, bool directory) {
  auto it = handles_.find(handle);
  if (it == handles_.end()) return;
  const uint64_t agent_fd = it->second.agent_fd;
  auto link = linkOf(it->second.generation);
  handles_.erase(it);
  if (!link || !link->lost.ok() || !link->session || closing_) return;
  v1::Request request;
  if (directory) {
    request.mutable_file()->mutable_closedir()->set_dir(agent_fd);
  } else {
    request.mutable_file()->mutable_close()->set_fd(agent_fd);
  }
  // Its answer finds no pending call and is dropped.
  if (link->session->sendRequest(std::move(request)).ok()) link->wake();
}

net::awaitable<absl::StatusOr<v1::Response>> Client::callOn(
    std::shared_ptr<Link> link_in, v1::Request request, std::chrono::milliseconds timeout,
    uint64_t subscription, std::shared_ptr<protocol::PipedBytes>* piped) {
  const std::shared_ptr<Link> link = std::move(link_in);
  if (!link->lost.ok()) co_return link->lost;
  auto pending = std::make_shared<Pending>(ex_);
  if (subscribes(request)) {
    pending->subscribe = true;
    pending->subscription = subscription;
    pending->request = request;
  }
  auto id = link->session->sendRequest(std::move(request));
  if (!id.ok()) co_return id.status();
  link->pending[*id] = pending;
  // Marked before any byte of the answer can arrive (the request is not
  // written until wake()); the session forgets the mark as it answers.
  if (piped) link->session->expectPiped(*id);
  link->wake();
  auto deadline = steady_timer::clock_type::now() + timeout;
  while (!pending->result && steady_timer::clock_type::now() < deadline) {
    co_await pending->done.wait(deadline);
  }
  link->pending.erase(*id);
  if (piped) {
    if (link->session) link->session->forgetPiped(*id);
    *piped = std::move(pending->piped);
  }
  if (!pending->result) {
    co_return protoError(v1::TIMEOUT, absl::StrCat("no response to request ", *id, " within ",
                                                   timeout.count(), " ms"));
  }
  co_return std::move(*pending->result);
}

net::awaitable<absl::StatusOr<std::shared_ptr<ClientStream>>> Client::openStream(
    v1::StreamOpen open) {
  if (!lost_.ok()) co_return lost_;
  if (!link_) co_return protoError(v1::FAILED_PRECONDITION, "not connected");
  (void)co_await waitForMove(steady_timer::clock_type::now() + options_.failover_timeout);
  if (!lost_.ok()) co_return lost_;
  const std::shared_ptr<Link> link = link_;
  if (!link->lost.ok()) co_return link->lost;
  auto id = link->session->openStream(std::move(open));
  if (!id.ok()) co_return id.status();
  auto stream = std::make_shared<ClientStream>(shared_from_this(), link, *id);
  link->add(*id, stream);
  link->wake();
  while (!stream->accepted_ && stream->error_.ok()) co_await stream->writable_.wait();
  if (!stream->error_.ok()) {
    link->streams.erase(*id);
    co_return stream->error_;
  }
  co_return stream;
}

absl::Status Client::acceptStream(ClientStream& stream) {
  Link& link = *stream.link_;
  if (!link.lost.ok()) return link.lost;
  v1::StreamAccept accept;
  accept.set_stream_id(stream.id());
  RETURN_IF_ERROR(link.session->acceptStream(std::move(accept)));
  link.wake();
  return absl::OkStatus();
}

// ------------------------------------------------------- from the Links

void Client::onResponse(Link& link, v1::Response response,
                        std::shared_ptr<protocol::PipedBytes> piped) {
  auto it = link.pending.find(response.request_id());
  if (it == link.pending.end()) {
    // Timed out meanwhile. A subscribe the agent made after its caller gave
    // up would keep the port stolen (or mirrored) for the session's life,
    // each connection reset here for want of a Subscription: undo it. Its
    // answer, too, finds nobody waiting and is dropped.
    if (response.has_subscribed() && !response.has_error()) {
      v1::Request undo;
      undo.mutable_unsubscribe()->set_subscription_id(response.subscribed().subscription_id());
      if (link.session->sendRequest(std::move(undo)).ok()) link.wake();
    }
    return;
  }
  Pending& p = *it->second;
  if (response.has_error() && response.error().code() != v1::OK) {
    p.result = fromProtoError(response.error());
  } else {
    if (p.subscribe && response.has_subscribed()) {
      // Mapped now, in the same dispatch: a stream of this subscription may
      // follow in the very next frame.
      const uint64_t agent_id = response.subscribed().subscription_id();
      const uint64_t id = p.subscription != 0
                              ? p.subscription
                              : clientId(subscriptions_, agent_id, link.generation,
                                         &next_subscription_);
      auto held = subscriptions_.find(id);
      if (p.subscription != 0 && held == subscriptions_.end()) {
        // Unsubscribed while it was being made here (a replica, a
        // failover): undo it on this agent too.
        v1::Request undo;
        undo.mutable_unsubscribe()->set_subscription_id(agent_id);
        if (link.session->sendRequest(std::move(undo)).ok()) link.wake();
        p.result = protoError(v1::CANCELLED, absl::StrCat("subscription ", id, " was ended"));
        p.done.notify();
        return;
      }
      Subscription& sub = subscriptions_[id];
      if (held == subscriptions_.end()) sub.request = std::move(p.request);
      sub.agents[link.generation] = agent_id;
      link.subscription_ids[agent_id] = id;
      response.mutable_subscribed()->set_subscription_id(id);
    }
    p.result = std::move(response);
    p.piped = std::move(piped);
  }
  p.done.notify();
}

namespace {

// The subscription (the agent's id) a stream the agent opens belongs to;
// nullopt for kinds that belong to none.
std::optional<uint64_t> subscriptionOf(const v1::StreamOpen& open) {
  if (open.has_stolen()) return open.stolen().subscription_id();
  if (open.has_mirrored()) return open.mirrored().subscription_id();
  if (open.has_stolen_request()) return open.stolen_request().subscription_id();
  return std::nullopt;
}

void setSubscription(v1::StreamOpen& open, uint64_t id) {
  if (open.has_stolen()) open.mutable_stolen()->set_subscription_id(id);
  if (open.has_mirrored()) open.mutable_mirrored()->set_subscription_id(id);
  if (open.has_stolen_request()) open.mutable_stolen_request()->set_subscription_id(id);
}

}  // namespace

void Client::onTargetRestarted(Link& link, v1::TargetRestarted restarted) {
  if (&link != link_.get() || !on_target_restarted_) return;
  on_target_restarted_(restarted);
}

void Client::onNotice(Link& link, v1::SubscriptionNotice notice) {
  if (&link != link_.get() || !on_notice_) return;
  // In this client's ids, as everything else it hands out (taken_by stays
  // the agent's: it is usually another client's).
  auto it = link.subscription_ids.find(notice.subscription_id());
  notice.set_subscription_id(it == link.subscription_ids.end() ? 0 : it->second);
  on_notice_(notice);
}

void Client::onFileEvents(Link& link, v1::FileEvents events) {
  if (&link != link_.get() || !on_file_events_) return;
  on_file_events_(events);
}

void Client::onStreamOpen(Link& link, v1::StreamOpen open) {
  auto stream =
      std::make_shared<ClientStream>(shared_from_this(), link.shared_from_this(), open.stream_id());
  // Registered before anything else: frames that come before the acceptor
  // takes it (a mirror's gaps) or while it is parked wait in it.
  link.add(open.stream_id(), stream);
  const std::optional<uint64_t> agent_id = subscriptionOf(open);
  if (agent_id && link.resubscribing && !link.subscription_ids.contains(*agent_id)) {
    link.parked.emplace_back(std::move(stream), std::move(open));
    return;
  }
  handOver(link, std::move(stream), std::move(open));
}

void Client::handOver(Link& link, std::shared_ptr<ClientStream> stream, v1::StreamOpen open) {
  if (const std::optional<uint64_t> agent_id = subscriptionOf(open)) {
    auto it = link.subscription_ids.find(*agent_id);
    // Unknown: 0, which no subscription of this client has.
    setSubscription(open, it == link.subscription_ids.end() ? 0 : it->second);
  }
  if (!acceptor_) {
    stream->reset(v1::UNIMPLEMENTED, "this client accepts no streams");
    return;
  }
  acceptor_(std::move(stream), std::move(open));
}

void Client::onDraining(Link& link, v1::Draining draining) {
  if (options_.replicas) {
    link.retiring = true;
    if (&link == link_.get()) {
      replaceCurrent(link.shared_from_this(), absl::StrCat("draining (", draining.reason(), ")"),
                     /*draining=*/true, link.openStreams(), 0);
      if (link_.get() == &link && on_draining_) on_draining_(draining);
      return;
    }
    ReplicaEvent event;
    event.kind = ReplicaEvent::Kind::kDraining;
    event.endpoint = link.endpoint;
    event.reason = draining.reason();
    event.streams = link.openStreams();
    emitReplica(std::move(event));
    return;
  }
  if (&link == link_.get() && !moving_ && canFailover()) {
    FailoverEvent event;
    event.from = link.endpoint;
    event.reason = absl::StrCat("draining (", draining.reason(), ")");
    event.draining = true;
    event.streams = link.openStreams();
    spawnFailover(link.shared_from_this(), std::move(event), std::move(draining));
    return;
  }
  if (&link == link_.get() && on_draining_) on_draining_(draining);
}

}  // namespace siphon::client
