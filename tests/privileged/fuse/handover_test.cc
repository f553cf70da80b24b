// `siphon fs mount` across a handover of its agent (docs/CONTINUITY.md,
// "Handover"), as root, on the mount tests' fixture (mount_fixture.h: a
// chrooted pod, the real agent with its file helper, the real mount):
//
//  - a file of the mount open in this process, read part-way before the
//    handover and to its end after it, with read(2) (the offset is the
//    open file's): byte-exact;
//  - a directory of the mount listed part-way before and to its end after:
//    every name once;
//  - a file of the mount open for writing, written before and after, then
//    closed: the pod's file holds both, in order;
//  - a change the pod makes after the handover is pushed by the watches
//    that moved: the mount shows it although its attribute timeout is 60 s;
//  - the old agent exits 0 and its file helper goes with it; the mount
//    says once that its agent was handed over, and keeps serving.
//
// Without root every test skips.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <set>

#include "tests/privileged/fuse/mount_fixture.h"

namespace siphon {
namespace {

using namespace siphon::harness;    // NOLINT: test file
using namespace siphon::fuse_test;  // NOLINT: test file
using ::testing::HasSubstr;

constexpr size_t kMiB = 1 << 20;
constexpr size_t kBig = 32 * kMiB;
constexpr int kEntries = 3000;

// Deterministic bytes: `size` of them from `seed`, different at every offset.
std::string patterned(uint32_t seed, size_t size) {
  std::string out(size, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    out[i] = static_cast<char>(x);
  }
  return out;
}

// read(2) until `n` bytes or EOF/an error; what came.
std::string readN(int fd, size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, out.data() + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

bool writeAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += static_cast<size_t>(w);
  }
  return true;
}

// The fs-helper processes whose parent is `pid`.
std::vector<pid_t> helpersOf(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = readFile(e.path().string() + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != pid) continue;
    if (readFile(e.path().string() + "/cmdline").find("fs-helper") == std::string::npos) continue;
    out.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return out;
}

// Whether `pid` has exited (gone, or a zombie nobody reaped yet).
bool exited(pid_t pid) {
  const std::string stat = readFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  return stat.empty() || (close != std::string::npos && close + 2 < stat.size() &&
                          (stat[close + 2] == 'Z' || stat[close + 2] == 'X'));
}

class MountHandoverTest : public MountFixture {
 protected:
  void TearDown() override {
    if (HasFailure() && next_) std::cerr << "--- new agent log\n" << next_->log() << "---\n";
    if (HasFailure() && mount_) std::cerr << "--- mount stderr\n" << mount_->err << "---\n";
    for (DIR* d : dirs_) ::closedir(d);
    for (int fd : fds_) ::close(fd);
    MountFixture::TearDown();
    next_.reset();
  }

  int openOnMount(const std::string& path, int flags, mode_t mode = 0) {
    const int fd = ::open((mnt_ + path).c_str(), flags | O_CLOEXEC, mode);
    if (fd >= 0) fds_.push_back(fd);
    return fd;
  }

  std::string socket_;
  std::optional<Agent> next_;
  std::vector<int> fds_;
  std::vector<DIR*> dirs_;
};

TEST_F(MountHandoverTest, OpenFilesListingsWritesAndWatchesGoOnAcrossAHandover) {
  const std::string big = patterned(7, kBig);
  writeHost(root_ + "/data/big", big);
  std::filesystem::create_directories(root_ + "/data/many");
  for (int i = 0; i < kEntries; ++i) {
    writeHost(root_ + "/data/many/entry-" + std::to_string(i), "");
  }
  writeHost(root_ + "/data/watched", "v1\n");
  socket_ = dir_->path() + "/handover.sock";
  ASSERT_NO_FATAL_FAILURE(
      launchAgent(&agent_, &endpoint_, pod_.pid(), "rw", {"--handover-socket", socket_}));
  ASSERT_NO_FATAL_FAILURE(mount({"--attr-timeout", "60"}));

  // Before: a quarter of the big file, a sixth of the listing, 1 MiB
  // written, the watched file read (cached for 60 s).
  const int in = openOnMount("/data/big", O_RDONLY);
  ASSERT_GE(in, 0) << strerror(errno);
  ASSERT_EQ(readN(in, kBig / 4), big.substr(0, kBig / 4)) << "before the handover";
  DIR* listing = ::opendir((mnt_ + "/data/many").c_str());
  ASSERT_NE(listing, nullptr) << strerror(errno);
  dirs_.push_back(listing);
  std::multiset<std::string> names;
  for (int i = 0; i < kEntries / 6; ++i) {
    struct dirent* e = ::readdir(listing);
    ASSERT_NE(e, nullptr);
    names.insert(e->d_name);
  }
  const int out = openOnMount("/data/out", O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(out, 0) << strerror(errno);
  const std::string written = patterned(9, 2 * kMiB);
  ASSERT_TRUE(writeAll(out, written.substr(0, kMiB))) << strerror(errno);
  ASSERT_EQ(readFile(mnt_ + "/data/watched"), "v1\n");
  const std::vector<pid_t> old_helpers = helpersOf(agent_->child().pid());
  ASSERT_EQ(old_helpers.size(), 1u) << "the old agent's file helper";

  // The handover.
  const std::vector<std::string> args = {
      "--listen",  "127.0.0.1:0", "--token-file", token_file_, "--fs-mode", "rw",
      "--handover-socket", socket_, "--take-over", socket_,
      "targeted", "--pid", std::to_string(pod_.pid())};
  next_.emplace(args, cleanEnv(), dir_->path() + "/agent-next.log");
  std::string endpoint;
  ASSERT_TRUE(next_->ready(&endpoint));
  EXPECT_EQ(endpoint, endpoint_) << "the new agent serves the old one's listener";
  EXPECT_EQ(agent_->child().waitUntil(Clock::now() + std::chrono::seconds(10)), 0)
      << agent_->log();
  EXPECT_THAT(agent_->log(), HasSubstr("handover_done"));
  EXPECT_THAT(agent_->log(), HasSubstr("files_exported"));

  // After: the rest of everything, from where it was.
  EXPECT_EQ(readN(in, kBig), big.substr(kBig / 4)) << "the read goes on at its offset";
  for (struct dirent* e = ::readdir(listing); e != nullptr; e = ::readdir(listing)) {
    names.insert(e->d_name);
  }
  std::multiset<std::string> want = {".", ".."};
  for (int i = 0; i < kEntries; ++i) want.insert("entry-" + std::to_string(i));
  EXPECT_EQ(names.size(), want.size()) << "entries listed twice or missed";
  EXPECT_TRUE(names == want) << "the listing is not the directory";
  ASSERT_TRUE(writeAll(out, written.substr(kMiB))) << strerror(errno);
  EXPECT_EQ(::close(out), 0) << strerror(errno);
  fds_.erase(std::find(fds_.begin(), fds_.end(), out));
  EXPECT_TRUE(readFile(root_ + "/data/out") == written) << "the pod's file is not what was written";

  // A change in the pod: pushed by the watch that moved (60 s attribute
  // timeout: nothing else would show it within the wait).
  writeHost(root_ + "/data/watched", "version-2\n");
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  std::string seen;
  while ((seen = readFile(mnt_ + "/data/watched")) != "version-2\n" && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(seen, "version-2\n") << "the change was not pushed after the handover";

  // The old file helper went with its agent; the new agent has its own.
  EXPECT_TRUE(exited(old_helpers[0])) << "the old agent's file helper is still running";
  EXPECT_EQ(helpersOf(next_->child().pid()).size(), 1u);
  EXPECT_TRUE(mount_->readUntil([](const std::string&, const std::string& err) {
    return err.find("handed over to a new agent process") != std::string::npos;
  })) << mount_->err;
  EXPECT_TRUE(isMounted(mnt_));
  EXPECT_EQ(readFile(mnt_ + "/data/watched"), "version-2\n");
}

}  // namespace
}  // namespace siphon
