// LineWriter: lines go out in order; a reader that stops never blocks the
// writer's caller, and what was dropped meanwhile is said once it reads again.
#include "cli/line_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace siphon::cli {
namespace {

std::string readAvailable(int fd) {
  std::string out;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

TEST(LineWriter, WritesEveryLineInOrder) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  {
    LineWriter w(p[1]);
    for (int i = 0; i < 100; ++i) w.write("line " + std::to_string(i) + "\n");
    w.flush();
    EXPECT_EQ(w.dropped(), 0u);
  }
  ::close(p[1]);
  std::string expected;
  for (int i = 0; i < 100; ++i) expected += "line " + std::to_string(i) + "\n";
  EXPECT_EQ(readAvailable(p[0]), expected);
  ::close(p[0]);
}

// Lines from several threads while a slow reader drains the pipe: the
// writer thread batches whatever queued meanwhile into one writev, and every
// line comes out whole, once, in each thread's order.
TEST(LineWriter, ConcurrentLinesComeOutWholeAndInEachWritersOrder) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  constexpr int kThreads = 4, kLines = 5000;
  std::string got;
  std::thread reader([&] {
    char buf[1024];  // small reads: the writer's batches pile up
    while (true) {
      ssize_t n = ::read(p[0], buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
  });
  uint64_t dropped = 0;
  {
    LineWriter w(p[1], /*max_queued=*/64 << 20);
    std::vector<std::thread> writers;
    for (int t = 0; t < kThreads; ++t) {
      writers.emplace_back([&w, t] {
        for (int i = 0; i < kLines; ++i) {
          w.write("writer " + std::to_string(t) + " line " + std::to_string(i) + "\n");
        }
      });
    }
    for (auto& th : writers) th.join();
    w.flush();
    dropped = w.dropped();
  }
  ::close(p[1]);
  reader.join();
  ::close(p[0]);
  EXPECT_EQ(dropped, 0u);
  std::map<int, int> next;  // writer -> the line expected next
  std::istringstream in(got);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    int t = -1, i = -1;
    ASSERT_EQ(std::sscanf(line.c_str(), "writer %d line %d", &t, &i), 2) << line;
    ASSERT_EQ(i, next[t]) << "writer " << t << " out of order";
    ++next[t];
    ++lines;
  }
  EXPECT_EQ(lines, kThreads * kLines);
}

// A pipe filled to the brim that nobody reads, its write end blocking as
// stderr's does. Returns the bytes it took.
ssize_t fullBlockingPipe(int p[2]) {
  EXPECT_EQ(::pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
  std::string fill(4096, 'x');
  ssize_t filled = 0;
  while (true) {
    ssize_t n = ::write(p[1], fill.data(), fill.size());
    if (n <= 0) break;
    filled += n;
  }
  int flags = ::fcntl(p[1], F_GETFL);
  ::fcntl(p[1], F_SETFL, flags & ~O_NONBLOCK);
  return filled;
}

TEST(LineWriter, AFullPipeDropsAndCountsInsteadOfBlocking) {
  int p[2];
  const ssize_t filled = fullBlockingPipe(p);
  {
    LineWriter w(p[1], /*max_queued=*/100);
    // Returns at once, though nothing can be written: 50 lines of 9 bytes
    // into room for 11 (and one in the writer's hands).
    for (int i = 0; i < 50; ++i) w.write("line " + std::to_string(100 + i) + "\n");
    EXPECT_GE(w.dropped(), 37u);
    EXPECT_LE(w.dropped(), 40u);
    // The reader comes back.
    std::string got;
    while (got.size() < static_cast<size_t>(filled)) got += readAvailable(p[0]);
    w.flush();
    // What follows the filler (the last read may have taken some of it).
    std::string rest = (got + readAvailable(p[0])).substr(static_cast<size_t>(filled));
    EXPECT_EQ(rest.find("line 100\n"), 0u) << rest;
    EXPECT_NE(rest.find("siphon: " + std::to_string(w.dropped()) +
                        " lines dropped: nobody read them in time\n"),
              std::string::npos)
        << rest;
  }
  ::close(p[1]);
  ::close(p[0]);
}

// tryWrite() is for raw output: a refused chunk is the caller's to count,
// and nothing about it ever reaches the fd.
TEST(LineWriter, TryWriteRefusesWhatDoesNotFitAndSaysNothing) {
  int p[2];
  const ssize_t filled = fullBlockingPipe(p);
  {
    LineWriter w(p[1], /*max_queued=*/100);
    size_t accepted = 0, refused = 0;
    std::string expected;
    for (int i = 0; i < 50; ++i) {
      std::string chunk = "chunk" + std::to_string(10 + i);  // 7 bytes, no newline
      if (w.tryWrite(chunk)) {
        ++accepted;
        expected += chunk;
      } else {
        ++refused;
      }
    }
    EXPECT_GE(refused, 35u);
    EXPECT_GE(accepted, 14u);  // room for 14, plus one in the writer's hands
    EXPECT_EQ(w.dropped(), 0u);
    EXPECT_EQ(w.queuedBytes(), accepted * 7);
    std::string got;
    while (got.size() < static_cast<size_t>(filled) + expected.size()) got += readAvailable(p[0]);
    w.flush();
    EXPECT_EQ(w.queuedBytes(), 0u);
    EXPECT_EQ((got + readAvailable(p[0])).substr(static_cast<size_t>(filled)), expected);
  }
  ::close(p[1]);
  ::close(p[0]);
}

}  // namespace
}  // namespace siphon::cli
