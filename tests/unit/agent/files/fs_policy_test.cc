// --fs-mode decisions per request kind.
#include "agent/files/fs_policy.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "siphon/status.h"

namespace siphon::agent::files {
namespace {

v1::FileRequest openWith(int flags) {
  v1::FileRequest r;
  r.mutable_open()->set_path("/etc/hosts");
  r.mutable_open()->set_flags(flags);
  return r;
}

// One request of every kind that changes the file system.
std::vector<v1::FileRequest> writeLike() {
  std::vector<v1::FileRequest> out;
  for (int flags : {O_WRONLY, O_RDWR, O_RDONLY | O_CREAT, O_RDONLY | O_TRUNC, O_RDONLY | O_APPEND,
                    O_TMPFILE | O_RDWR, O_ACCMODE}) {
    out.push_back(openWith(flags));
  }
  v1::FileRequest r;
  r.mutable_write()->set_fd(1);
  out.push_back(r);
  r.mutable_pwrite()->set_fd(1);
  out.push_back(r);
  r.mutable_mkdir()->set_path("/d");
  out.push_back(r);
  r.mutable_rmdir()->set_path("/d");
  out.push_back(r);
  r.mutable_unlink()->set_path("/f");
  out.push_back(r);
  r.mutable_rename()->set_from("/a");
  out.push_back(r);
  r.mutable_truncate()->set_path("/f");
  out.push_back(r);
  r.mutable_ftruncate()->set_fd(1);
  out.push_back(r);
  r.mutable_chmod()->set_path("/f");
  out.push_back(r);
  r.mutable_chown()->set_path("/f");
  out.push_back(r);
  r.mutable_utimens()->set_path("/f");
  out.push_back(r);
  r.mutable_symlink()->set_linkpath("/l");
  out.push_back(r);
  r.mutable_link()->set_newpath("/l");
  out.push_back(r);
  r.mutable_mknod()->set_path("/p");
  out.push_back(r);
  r.mutable_setxattr()->set_path("/f");
  out.push_back(r);
  r.mutable_removexattr()->set_path("/f");
  out.push_back(r);
  return out;
}

std::vector<v1::FileRequest> readOnly() {
  std::vector<v1::FileRequest> out;
  out.push_back(openWith(O_RDONLY));
  out.push_back(openWith(O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  v1::FileRequest r;
  r.mutable_read()->set_fd(1);
  out.push_back(r);
  r.mutable_pread()->set_fd(1);
  out.push_back(r);
  r.mutable_seek()->set_fd(1);
  out.push_back(r);
  r.mutable_close()->set_fd(1);
  out.push_back(r);
  r.mutable_stat()->set_path("/");
  out.push_back(r);
  r.mutable_fstat()->set_fd(1);
  out.push_back(r);
  r.mutable_statfs()->set_path("/");
  out.push_back(r);
  r.mutable_access()->set_path("/");
  out.push_back(r);
  r.mutable_readlink()->set_path("/l");
  out.push_back(r);
  r.mutable_opendir()->set_path("/");
  out.push_back(r);
  r.mutable_readdir()->set_dir(1);
  out.push_back(r);
  r.mutable_closedir()->set_dir(1);
  out.push_back(r);
  r.mutable_readdir()->set_with_stat(true);
  out.push_back(r);
  r.mutable_getxattr()->set_path("/f");
  out.push_back(r);
  r.mutable_listxattr()->set_path("/f");
  out.push_back(r);
  r.mutable_fsync()->set_fd(1);
  out.push_back(r);
  return out;
}

TEST(FsPolicyTest, ReadOnlyRefusesEveryWriteLikeRequestWithErofs) {
  for (const auto& r : writeLike()) {
    EXPECT_TRUE(isWriteLike(r)) << r.ShortDebugString();
    absl::Status s = checkFsMode(FsMode::kReadOnly, r);
    EXPECT_EQ(errorCodeOf(s), v1::ERRNO) << r.ShortDebugString();
    EXPECT_EQ(errnoOf(s), EROFS) << r.ShortDebugString();
    EXPECT_TRUE(checkFsMode(FsMode::kReadWrite, r).ok());
  }
}

TEST(FsPolicyTest, ReadOnlyLetsReadsThrough) {
  for (const auto& r : readOnly()) {
    EXPECT_FALSE(isWriteLike(r)) << r.ShortDebugString();
    EXPECT_TRUE(checkFsMode(FsMode::kReadOnly, r).ok()) << r.ShortDebugString();
  }
}

TEST(FsPolicyTest, OffRefusesEverythingWithPermissionDenied) {
  auto all = writeLike();
  for (auto& r : readOnly()) all.push_back(r);
  for (const auto& r : all) {
    absl::Status s = checkFsMode(FsMode::kOff, r);
    EXPECT_EQ(errorCodeOf(s), v1::PERMISSION_DENIED) << r.ShortDebugString();
    EXPECT_EQ(s.message(), "file access is off (--fs-mode off)");
  }
}

// The refusal under ro is the agent's, and says so: a client shows the reason
// after strerror (the CLI: "Read-only file system (EROFS): the agent ...").
TEST(FsPolicyTest, ReadOnlyGivesItsReason) {
  v1::FileRequest r;
  r.mutable_mkdir()->set_path("/data/x");
  const absl::Status s = checkFsMode(FsMode::kReadOnly, r);
  EXPECT_EQ(errnoOf(s), EROFS);
  EXPECT_EQ(errnoReason(s), "the agent serves files read-only (siphon-agent --fs-mode ro)");
  EXPECT_EQ(errnoReason(fromProtoError(toProtoError(s))), errnoReason(s)) << "lost on the wire";
}

TEST(FsPolicyTest, RequestNames) {
  v1::FileRequest r;
  r.mutable_mkdir()->set_path("/data/x");
  EXPECT_EQ(fileOpName(r), "mkdir");
  r.mutable_pwrite()->set_fd(7);
  EXPECT_EQ(fileRequestTarget(r), "fd 7");
  r.mutable_rename()->set_from("/a");
  r.mutable_rename()->set_to("/b");
  EXPECT_EQ(fileRequestTarget(r), "/a to /b");
  EXPECT_EQ(fileOpName(v1::FileRequest()), "(none)");
}

// An op this build does not know (a newer schema's, or one added to the
// proto without a place here) must fail closed under ro, not pass as a read.
TEST(FsPolicyTest, UnknownOpIsWriteLike) {
  const auto* oneof = v1::FileRequest::descriptor()->FindOneofByName("op");
  ASSERT_NE(oneof, nullptr);
  // The unknown op is a number no field of the oneof has, inside the range
  // of OpCase's values (an enum without a fixed type holds 0..2^k-1 for the
  // smallest 2^k above its largest enumerator; a value outside is undefined
  // behaviour, which clang's UBSan reports).
  int largest = 0;
  for (int i = 0; i < oneof->field_count(); ++i) {
    largest = std::max(largest, oneof->field(i)->number());
  }
  int range = 1;
  while (range <= largest) range <<= 1;
  int number = range - 1;
  auto named = [&](int n) {
    for (int i = 0; i < oneof->field_count(); ++i) {
      if (oneof->field(i)->number() == n) return true;
    }
    return false;
  };
  while (number > 0 && named(number)) --number;
  ASSERT_GT(number, 0) << "every value of OpCase's range is an op";
  EXPECT_TRUE(isWriteLikeOp(static_cast<v1::FileRequest::OpCase>(number), O_RDONLY));
  // Every op the schema names is placed on one side on purpose: the read
  // ones stay reads.
  int reads = 0;
  for (int i = 0; i < oneof->field_count(); ++i) {
    const auto op = static_cast<v1::FileRequest::OpCase>(oneof->field(i)->number());
    if (!isWriteLikeOp(op, O_RDONLY)) ++reads;
  }
  EXPECT_EQ(reads, 18) << "read-like ops: open O_RDONLY, read, pread, seek, close, stat, fstat, "
                          "statfs, access, readlink, opendir, readdir, closedir, getxattr, "
                          "listxattr, fsync, watch, unwatch";
}

}  // namespace
}  // namespace siphon::agent::files
