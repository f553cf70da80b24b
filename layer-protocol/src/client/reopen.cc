// ClientOptions::reopen_files: a file handle whose session is lost (its
// pod went, and the session moved to another pod's agent) is opened again
// by path on the current session at its next use, when the file there is
// the same one: the same type, size and modification time as when it was
// opened (files of the same image are, across a workload's pods). Then it
// goes on at the offset it had. When the file differs, or cannot be
// opened, the handle answers ESTALE from then on (closing it succeeds):
// the program is told, never handed another file's bytes.
#include <errno.h>

#include "absl/strings/str_cat.h"
#include "client/link.h"
#include "siphon/status.h"

namespace siphon::client {

namespace {

bool sameFile(const v1::FileStat& a, const v1::FileStat& b) {
  return (a.mode() & 0170000) == (b.mode() & 0170000) && a.size() == b.size() &&
         a.mtime_ns() == b.mtime_ns();
}

}  // namespace

net::awaitable<absl::Status> Client::reopen(uint64_t handle, std::chrono::milliseconds timeout) {
  auto it = handles_.find(handle);
  if (it == handles_.end()) co_return errnoStatus(EBADF, absl::StrCat("fd ", handle));
  const std::string path = it->second.path;
  if (it->second.stale) {
    co_return errnoStatus(ESTALE, absl::StrCat("fd ", handle, " (", path,
                                               "): the file is not the one that was opened"));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (!co_await waitForMove(deadline) || !link_ || !lost_.ok()) {
    co_return errnoStatus(EBADF, absl::StrCat("fd ", handle, " (", path,
                                              "): no agent to open it again on"));
  }
  const std::shared_ptr<Link> link = link_;
  auto stale = [&](std::string why) {
    auto h = handles_.find(handle);
    if (h != handles_.end()) h->second.stale = true;
    return errnoStatus(ESTALE, absl::StrCat("fd ", handle, " (", path, ", opened on ",
                                            it->second.endpoint, "): ", why));
  };
  v1::Request open;
  open.mutable_file()->mutable_open()->set_path(path);
  open.mutable_file()->mutable_open()->set_flags(it->second.flags);
  auto opened = co_await callOn(link, std::move(open), timeout, 0);
  if (!opened.ok() || !opened->has_file() || !opened->file().has_opened()) {
    co_return stale(absl::StrCat("cannot open it again on ", link->endpoint, ": ",
                                 opened.ok() ? "no handle" : opened.status().message()));
  }
  const uint64_t agent_fd = opened->file().opened().fd();
  auto close_new = [&] {
    v1::Request close;
    close.mutable_file()->mutable_close()->set_fd(agent_fd);
    if (link->session && link->session->sendRequest(std::move(close)).ok()) link->wake();
  };
  v1::Request fstat;
  fstat.mutable_file()->mutable_fstat()->set_fd(agent_fd);
  auto st = co_await callOn(link, std::move(fstat), timeout, 0);
  it = handles_.find(handle);
  if (it == handles_.end()) {
    close_new();
    co_return errnoStatus(EBADF, absl::StrCat("fd ", handle, " was closed"));
  }
  if (!st.ok() || !st->has_file() || !st->file().has_stat()) {
    close_new();
    co_return stale(absl::StrCat("cannot stat it on ", link->endpoint));
  }
  if (!sameFile(st->file().stat(), it->second.identity)) {
    close_new();
    co_return stale(absl::StrCat("the file on ", link->endpoint, " is another one (size ",
                                 it->second.identity.size(), " -> ", st->file().stat().size(),
                                 ", mtime ", it->second.identity.mtime_ns(), " -> ",
                                 st->file().stat().mtime_ns(), " ns)"));
  }
  if (it->second.offset != 0) {
    v1::Request seek;
    seek.mutable_file()->mutable_seek()->set_fd(agent_fd);
    seek.mutable_file()->mutable_seek()->set_offset(it->second.offset);
    seek.mutable_file()->mutable_seek()->set_whence(SEEK_SET);
    auto sought = co_await callOn(link, std::move(seek), timeout, 0);
    it = handles_.find(handle);
    if (!sought.ok() || it == handles_.end()) {
      close_new();
      co_return stale("cannot go back to its offset");
    }
  }
  it->second.generation = link->generation;
  it->second.agent_fd = agent_fd;
  it->second.endpoint = link->endpoint;
  co_return absl::OkStatus();
}

void Client::trackOffset(uint64_t handle, const v1::Response& response, size_t piped) {
  auto it = handles_.find(handle);
  if (it == handles_.end() || !response.has_file()) return;
  const v1::FileResponse& f = response.file();
  if (f.has_data()) {
    it->second.offset += static_cast<int64_t>(f.data().data().size() + piped);
  } else if (f.has_written()) {
    it->second.offset += static_cast<int64_t>(f.written().written());
  } else if (f.has_offset()) {
    it->second.offset = f.offset().offset();
  }
}

}  // namespace siphon::client
