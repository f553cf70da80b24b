// files: the file requests (siphon.v1.FileRequest) inside the target's root.
//
// Paths resolve under Target::rootFd() through RootFs (openat2,
// RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS), in the file helper process with
// the target's identity (fs_helper.h, file_system.h). --fs-mode decides first
// (fs_policy.h): off answers PERMISSION_DENIED, ro answers EROFS to every
// write-like request. Every system call runs on ServiceContext::blocking;
// the answer is posted back to the event loop and sent with
// SessionHost::respond(). Handles live per session (handles.h) and are
// closed when the session ends.
//
// Answers, besides the errno of the call itself:
//   read/pread    at most the session's negotiated max_read_size bytes per
//                 request (--max-read-size: a larger size is clamped, not
//                 refused: a short read, as read(2) may give); data+eof.
//                 Also clamped to the room the session's buffer has left
//                 (Session::reserveResponse), SESSION_BUFFER_FULL when none.
//   readdir       at most max_entries entries (0: kDefaultDirEntries; above
//                 kMaxDirEntries clamped) and max_read_size bytes of them
//                 (within the buffer's room, as reads).
//   getxattr,     E2BIG (a refusal naming the limit) when the value or the
//   listxattr     name list is larger than the session's max_read_size.
//   fsync         under --fs-mode ro answered OK without the call (every
//                 handle there is open for reading).
//   readdir       with_stat: each entry's lstat too (OpenDir::read).
//   opendir       read_entries: the first readdir in the same answer (room
//                 held as for a readdir); with close_at_eof, a listing that
//                 is whole closes the directory at once (closed, no handle
//                 taken from the session's limit).
//   handles       EBADF for a handle this session does not hold (closed,
//                 another session's, or a file handle given to readdir and
//                 the other way round); ERRNO EMFILE past
//                 max_handles_per_session (--max-open-files), its message
//                 naming the limit; a close frees a slot at once.
//   close         the handle is gone at once; its fd closes when no request
//                 still uses it, and a close(2) error is reported only when
//                 this request did the last close.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "agent/services/service.h"

namespace siphon::agent::files {

inline constexpr uint32_t kDefaultDirEntries = 1024;
inline constexpr uint32_t kMaxDirEntries = 4096;

class FileSystem;

struct FileServiceOptions {
  // Null: the file helper (AgentConfig::fs_helper_exe), or this process
  // when that is empty (makeFileSystem, fs_helper.h).
  std::shared_ptr<FileSystem> fs;
  // 0: the agent's --max-open-files (AgentConfig::max_open_files).
  size_t max_handles_per_session = 0;
};

}  // namespace siphon::agent::files

namespace siphon::agent {

std::shared_ptr<RequestService> makeFileService(ServiceContext& ctx,
                                                files::FileServiceOptions options = {});

}  // namespace siphon::agent
