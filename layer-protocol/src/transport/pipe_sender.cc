#include "siphon/transport/pipe_sender.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::net {
namespace {

// splice(2) into a socket whose peer is gone raises SIGPIPE (it takes no
// MSG_NOSIGNAL), which kills a process that does not ignore it (the agent
// does; a program embedding the library need not). Unless SIGPIPE is
// ignored, it is blocked around the call and one the call raised is taken
// before the mask comes back: also when the call returns bytes (it sends
// in batches, and a later batch's EPIPE raises it all the same).
ssize_t spliceToSocket(int from, int socket, size_t n) {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_IGN) {
    return ::splice(from, nullptr, socket, nullptr, n, SPLICE_F_NONBLOCK);
  }
  sigset_t pipe_set, old, pending;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigemptyset(&pending);
  ::sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  ::pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  const ssize_t k = ::splice(from, nullptr, socket, nullptr, n, SPLICE_F_NONBLOCK);
  const int err = errno;
  sigemptyset(&pending);
  if (!was_pending && ::sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
    const timespec zero{};
    while (::sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = err;
  return k;
}

}  // namespace

PipeSender::~PipeSender() { drop(); }

void PipeSender::drop() {
  if (read_ >= 0) ::close(read_);
  if (write_ >= 0) ::close(write_);
  read_ = write_ = -1;
  capacity_ = 0;
}

bool PipeSender::ready(size_t size) {
  if (read_ < 0) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return false;
    read_ = fds[0];
    write_ = fds[1];
    const int got = ::fcntl(write_, F_GETPIPE_SZ);
    capacity_ = got > 0 ? static_cast<size_t>(got) : 0;
  }
  if (capacity_ >= size) return true;
  const int got = ::fcntl(write_, F_SETPIPE_SZ, static_cast<int>(size));
  if (got < 0) return false;
  capacity_ = static_cast<size_t>(got);
  return capacity_ >= size;
}

awaitable<absl::StatusOr<size_t>> PipeSender::send(tcp::socket& socket, protocol::PipedBytes& data) {
  if (disabled_ || data.materialized() || data.size() == 0) co_return size_t{0};
  // The scratch pipe needs as many slots as the data's pipe has buffers:
  // the same capacity is enough.
  const int data_capacity = ::fcntl(data.fd(), F_GETPIPE_SZ);
  if (data_capacity <= 0 || !ready(static_cast<size_t>(data_capacity))) co_return size_t{0};
  ssize_t teed;
  do {
    teed = ::tee(data.fd(), write_, data.size(), SPLICE_F_NONBLOCK);
  } while (teed < 0 && errno == EINTR);
  if (teed <= 0) co_return size_t{0};  // the scratch pipe is still empty
  error_code ec;
  if (!socket.non_blocking()) socket.non_blocking(true, ec);
  if (ec) {
    drop();
    disabled_ = true;
    co_return size_t{0};
  }
  const auto want = static_cast<size_t>(teed);
  size_t sent = 0;
  while (sent < want) {
    const ssize_t n = spliceToSocket(read_, socket.native_handle(), want - sent);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    const int err = n == 0 ? EPIPE : errno;
    if (err == EINTR) continue;
    if (err == EAGAIN) {
      co_await socket.async_wait(tcp::socket::wait_write, asio::redirect_error(use_awaitable, ec));
      if (!ec) continue;
      drop();  // the rest of the scratch pipe is nobody's now
      co_return protoError(v1::UNAVAILABLE, absl::StrCat("wait to write: ", ec.message()));
    }
    drop();
    if (sent == 0 && (err == EINVAL || err == ENOSYS || err == EOPNOTSUPP)) {
      disabled_ = true;  // this socket takes no splice: the caller writes it all
      co_return size_t{0};
    }
    co_return protoError(v1::UNAVAILABLE, absl::StrCat("splice: ", std::strerror(err)));
  }
  co_return sent;
}

awaitable<absl::StatusOr<PipeReceiver::Received>> PipeReceiver::receive(
    tcp::socket& socket, size_t n, std::function<void()> progress) {
  Received out;
  if (disabled_ || n == 0) co_return out;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) co_return out;
  // The socket's bytes come as a buffer per page fragment of each skb: a
  // page can be cut in two by an skb's end, so twice the pages, else as
  // many (a fragment-heavy stream then ends in memory, below).
  if (::fcntl(fds[1], F_SETPIPE_SZ, static_cast<int>(2 * n)) < 0 &&
      ::fcntl(fds[1], F_SETPIPE_SZ, static_cast<int>(n)) < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    disabled_ = true;
    co_return out;
  }
  auto piped = std::make_shared<protocol::PipedBytes>(fds[0], n);
  const int in = fds[1];
  struct CloseIn {
    int fd;
    ~CloseIn() { ::close(fd); }
  } close_in{in};
  error_code ec;
  if (!socket.non_blocking()) socket.non_blocking(true, ec);
  if (ec) {
    disabled_ = true;
    co_return out;
  }
  size_t have = 0;
  int stalls = 0;  // splices in a row that took nothing while bytes waited
  while (have < n) {
    const ssize_t k =
        ::splice(socket.native_handle(), nullptr, in, nullptr, n - have, SPLICE_F_NONBLOCK);
    if (k > 0) {
      have += static_cast<size_t>(k);
      stalls = 0;
      if (progress) progress();
      continue;
    }
    if (k == 0) co_return protoError(v1::UNAVAILABLE, "connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno != EAGAIN) {
      co_return protoError(v1::UNAVAILABLE, absl::StrCat("splice: ", std::strerror(errno)));
    }
    int queued = 0;
    if (::ioctl(socket.native_handle(), FIONREAD, &queued) == 0 && queued > 0) {
      // Bytes wait in the socket: they may have come just after the splice
      // looked, so once more; taking none twice, the pipe is full. What it
      // holds goes back to memory, and the session reads the rest there.
      if (++stalls < 2) continue;
      out.partial.resize(have);
      for (size_t got = 0; got < have;) {
        const ssize_t r = ::read(piped->fd(), out.partial.data() + got, have - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) co_return protoError(v1::INTERNAL, "a receive pipe lost its bytes");
        got += static_cast<size_t>(r);
      }
      co_return out;
    }
    stalls = 0;
    co_await socket.async_wait(tcp::socket::wait_read, asio::redirect_error(use_awaitable, ec));
    if (ec) co_return protoError(v1::UNAVAILABLE, absl::StrCat("wait to read: ", ec.message()));
  }
  out.piped = std::move(piped);
  co_return out;
}

}  // namespace siphon::net
