#include "agent/steal/passthrough.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <array>
#include <string>

#include "siphon/status.h"
#include "siphon/transport/spawn.h"

namespace siphon::agent::steal {
namespace {

namespace asio = net::asio;
using Descriptor = asio::posix::stream_descriptor;

constexpr size_t kBuffer = 64 * 1024;

struct Splice final : SpliceHandle, std::enable_shared_from_this<Splice> {
  Splice(asio::any_io_executor ex, UniqueFd a, UniqueFd b, std::function<void()> done)
      : ex(ex), a(ex, a.release()), b(ex, b.release()), done(std::move(done)) {}
  ~Splice() override {
    net::error_code ignored;
    a.close(ignored);
    b.close(ignored);
    if (done) done();
  }

  // One direction: a buffer and the range of it read and not yet written.
  struct Way {
    std::string buf = std::string(kBuffer, '\0');
    size_t begin = 0, end = 0;
    bool running = false;
    bool done = false;  // EOF passed on, or aborted
  };

  asio::any_io_executor ex;
  Descriptor a;
  Descriptor b;
  std::function<void()> done;
  std::array<Way, 2> ways;  // [0] a -> b, [1] b -> a
  bool aborted = false;
  bool frozen = false;

  void abort() {
    if (aborted) return;
    aborted = true;
    for (Descriptor* d : {&a, &b}) {
      if (!d->is_open()) continue;
      linger l{1, 0};
      ::setsockopt(d->native_handle(), SOL_SOCKET, SO_LINGER, &l, sizeof(l));
      net::error_code ignored;
      d->close(ignored);
    }
  }

  void start(int way) {
    Way& w = ways[way];
    if (w.running || w.done || aborted) return;
    w.running = true;
    std::weak_ptr<Splice> weak = shared_from_this();
    net::spawn(ex, pipe(shared_from_this(), way), "passthrough_pipe", [weak] {
      // A direction that fails resets both sockets of this splice (the
      // other direction then ends), nothing else.
      if (auto alive = weak.lock()) alive->abort();
    });
  }

  // ---- SpliceHandle ----

  void freeze() override {
    if (frozen) return;
    frozen = true;
    net::error_code ignored;
    a.cancel(ignored);
    b.cancel(ignored);
  }
  void thaw() override {
    if (!frozen) return;
    frozen = false;
    start(0);
    start(1);
  }
  bool parked() const override { return frozen && !ways[0].running && !ways[1].running; }
  bool finished() const override { return aborted || (ways[0].done && ways[1].done); }
  absl::StatusOr<SpliceState> exportState() const override {
    if (!parked()) return absl::FailedPreconditionError("the splice is not parked");
    if (aborted || !a.is_open() || !b.is_open()) {
      return absl::FailedPreconditionError("the splice was aborted");
    }
    SpliceState s;
    const int da = ::fcntl(const_cast<Descriptor&>(a).native_handle(), F_DUPFD_CLOEXEC, 3);
    if (da < 0) return lastErrnoStatus("handover: dup a passthrough socket");
    s.a.reset(da);
    const int db = ::fcntl(const_cast<Descriptor&>(b).native_handle(), F_DUPFD_CLOEXEC, 3);
    if (db < 0) return lastErrnoStatus("handover: dup a passthrough socket");
    s.b.reset(db);
    s.a_to_b = ways[0].buf.substr(ways[0].begin, ways[0].end - ways[0].begin);
    s.b_to_a = ways[1].buf.substr(ways[1].begin, ways[1].end - ways[1].begin);
    s.a_to_b_done = ways[0].done;
    s.b_to_a_done = ways[1].done;
    return s;
  }

  // One direction, until EOF is passed on, an error, or a freeze (then it
  // parks: what it read and did not write stays in its Way). The last
  // holder out closes both sockets (the shared_ptr).
  static net::awaitable<void> pipe(std::shared_ptr<Splice> splice, int way) {
    const std::shared_ptr<Splice> s = std::move(splice);
    Way& w = s->ways[way];
    Descriptor& from = way == 0 ? s->a : s->b;
    Descriptor& to = way == 0 ? s->b : s->a;
    // Not running from here on however this ends (an exception included).
    struct Stopped {
      Way& w;
      ~Stopped() { w.running = false; }
    } stopped{w};
    while (!s->aborted && !s->frozen) {
      net::error_code ec;
      if (w.begin == w.end) {
        w.begin = w.end = 0;
        const size_t n = co_await from.async_read_some(
            asio::buffer(w.buf), asio::redirect_error(net::use_awaitable, ec));
        w.end = n;
        if (s->aborted) break;
        if (ec == asio::error::operation_aborted && s->frozen) break;
        if (ec == asio::error::eof) {
          ::shutdown(to.native_handle(), SHUT_WR);
          w.done = true;
          break;
        }
        if (ec) {
          s->abort();
          break;
        }
        continue;  // a freeze that came meanwhile parks with the bytes kept
      }
      const size_t n = co_await to.async_write_some(
          asio::buffer(w.buf.data() + w.begin, w.end - w.begin),
          asio::redirect_error(net::use_awaitable, ec));
      w.begin += n;
      if (s->aborted) break;
      if (ec == asio::error::operation_aborted && s->frozen) break;
      if (ec) {
        s->abort();
        break;
      }
    }
  }
};

}  // namespace

std::shared_ptr<SpliceHandle> splice(asio::any_io_executor ex, UniqueFd a, UniqueFd b,
                                     std::function<void()> done) {
  auto s = std::make_shared<Splice>(ex, std::move(a), std::move(b), std::move(done));
  s->start(0);
  s->start(1);
  return s;
}

std::shared_ptr<SpliceHandle> restoreSplice(asio::any_io_executor ex, SpliceState state,
                                            std::function<void()> done) {
  auto s = std::make_shared<Splice>(ex, std::move(state.a), std::move(state.b), std::move(done));
  s->frozen = true;
  for (int way = 0; way < 2; ++way) {
    const std::string& held = way == 0 ? state.a_to_b : state.b_to_a;
    Splice::Way& w = s->ways[way];
    if (held.size() > w.buf.size()) w.buf.resize(held.size());
    held.copy(w.buf.data(), held.size());
    w.begin = 0;
    w.end = held.size();
    w.done = way == 0 ? state.a_to_b_done : state.b_to_a_done;
  }
  return s;
}

}  // namespace siphon::agent::steal
