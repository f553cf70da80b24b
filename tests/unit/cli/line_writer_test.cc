// LineWriter: lines go out in order; a reader that stops never blocks the
// writer's caller, and what was dropped meanwhile is said once it reads again.
#include "cli/line_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <regex>
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
    // into room for 11, those in the writer's hands included.
    for (int i = 0; i < 50; ++i) w.write("line " + std::to_string(100 + i) + "\n");
    EXPECT_EQ(w.dropped(), 39u);
    // The reader comes back.
    std::string got;
    while (got.size() < static_cast<size_t>(filled)) got += readAvailable(p[0]);
    w.flush();
    // What follows the filler (the last read may have taken some of it):
    // the 11 lines that fit, in order, and lines saying how many were
    // dropped (one, or more when the writer took lines while the caller
    // was still dropping), adding up to every drop.
    std::string rest = (got + readAvailable(p[0])).substr(static_cast<size_t>(filled));
    std::istringstream in(rest);
    std::string line, kept;
    uint64_t said = 0;
    while (std::getline(in, line)) {
      std::smatch m;
      static const std::regex kSaid("siphon: ([0-9]+) lines? dropped: nobody read them in time");
      if (std::regex_match(line, m, kSaid)) {
        EXPECT_EQ(m[1] == "1", line.find(" line dropped") != std::string::npos) << line;
        EXPECT_FALSE(kept.empty()) << "a drop is said after the lines before it";
        said += std::stoull(m[1]);
      } else {
        kept += line + "\n";
      }
    }
    std::string expected;
    for (int i = 0; i < 11; ++i) expected += "line " + std::to_string(100 + i) + "\n";
    EXPECT_EQ(kept, expected) << rest;
    EXPECT_EQ(said, w.dropped()) << rest;
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
    // Room for 14, those in the writer's hands included, however many
    // the thread took into its write(2) at once.
    EXPECT_EQ(accepted, 14u);
    EXPECT_EQ(refused, 36u);
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
