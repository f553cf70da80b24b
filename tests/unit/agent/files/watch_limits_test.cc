// The agent-wide file watch limits (agent/files/watch_limits.h): derived
// from the node's inotify limits, read through an injected directory, and
// the flags that set them, checked against those limits (issue 40, item 5).
#include "agent/files/watch_limits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "agent/options.h"
#include "tests/unit/agent/files/files_test_util.h"

namespace siphon::agent::files {
namespace {

using ::testing::HasSubstr;

TEST(WatchLimitsTest, TheNodesLimitsAreReadAndBadValuesKeepTheKernelsDefaults) {
  testing::ScratchTree tree;
  const std::string dir = tree.base() + "/inotify";
  std::filesystem::create_directories(dir);
  testing::ScratchTree::write(dir + "/max_user_watches", "192540\n");
  testing::ScratchTree::write(dir + "/max_user_instances", "512\n");
  NodeInotifyLimits read = readNodeInotifyLimits(dir);
  EXPECT_EQ(read.max_user_watches, 192540u);
  EXPECT_EQ(read.max_user_instances, 512u);

  testing::ScratchTree::write(dir + "/max_user_watches", "lots\n");
  testing::ScratchTree::write(dir + "/max_user_instances", "0\n");
  read = readNodeInotifyLimits(dir);
  EXPECT_EQ(read.max_user_watches, kKernelDefaultMaxUserWatches);
  EXPECT_EQ(read.max_user_instances, kKernelDefaultMaxUserInstances);

  read = readNodeInotifyLimits(tree.base() + "/no-such-dir");
  EXPECT_EQ(read.max_user_watches, 8192u);
  EXPECT_EQ(read.max_user_instances, 128u);
}

TEST(WatchLimitsTest, TheDefaultIsAQuarterOfTheNodesLimit) {
  auto b = watchBudget(std::nullopt, std::nullopt, NodeInotifyLimits{8192, 128});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->watches, 2048u);
  EXPECT_EQ(b->instances, 32u);
  b = watchBudget(std::nullopt, std::nullopt, NodeInotifyLimits{3, 1});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->watches, 1u) << "never 0";
  EXPECT_EQ(b->instances, 1u);
  b = watchBudget(8192, 100, NodeInotifyLimits{8192, 128});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->watches, 8192u) << "the flag may take the node's whole limit";
  EXPECT_EQ(b->instances, 100u);
}

TEST(WatchLimitsTest, AFlagAboveTheNodesLimitOrZeroIsRefusedNamingIt) {
  auto b = watchBudget(8193, std::nullopt, NodeInotifyLimits{8192, 128});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.status().message(),
            "--max-file-watches 8193: above this node's fs.inotify.max_user_watches (8192), which "
            "the node's other processes of the same user (kubelet, containerd and systemd for "
            "uid 0) share");
  b = watchBudget(std::nullopt, 129, NodeInotifyLimits{8192, 128});
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(std::string(b.status().message()),
              HasSubstr("--max-file-watch-instances 129: above this node's "
                        "fs.inotify.max_user_instances (128)"));
  b = watchBudget(0, std::nullopt, NodeInotifyLimits{});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message(), "--max-file-watches 0: must be at least 1");
}

struct Parsed {
  ParsedOptions parsed;
  std::string err;
};

Parsed parse(std::vector<std::string> args, NodeInotifyLimits node) {
  args.insert(args.begin(), "siphon-agent");
  args.insert(args.begin() + 1, "--insecure-no-auth");
  args.push_back("targetless");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  Parsed p;
  p.parsed = parseOptions(static_cast<int>(argv.size()), argv.data(), nullptr, out, err, node);
  p.err = err.str();
  return p;
}

TEST(WatchLimitsTest, TheFlagsSetTheAgentsLimitsAndBadOnesExitTwo) {
  const NodeInotifyLimits node{192540, 128};
  Parsed p = parse({}, node);
  ASSERT_TRUE(p.parsed.options) << p.err;
  EXPECT_EQ(p.parsed.options->config.max_file_watches, 48135u);
  EXPECT_EQ(p.parsed.options->config.max_file_watch_instances, 32u);

  p = parse({"--max-file-watches", "1000", "--max-file-watch-instances", "4"}, node);
  ASSERT_TRUE(p.parsed.options) << p.err;
  EXPECT_EQ(p.parsed.options->config.max_file_watches, 1000u);
  EXPECT_EQ(p.parsed.options->config.max_file_watch_instances, 4u);

  p = parse({"--max-file-watches", "200000"}, node);
  EXPECT_FALSE(p.parsed.options);
  EXPECT_EQ(p.parsed.exit_code, kExitUsage);
  EXPECT_THAT(p.err, HasSubstr("siphon-agent: --max-file-watches 200000: above this node's "
                               "fs.inotify.max_user_watches (192540)"));
  p = parse({"--max-file-watch-instances", "0"}, node);
  EXPECT_EQ(p.parsed.exit_code, kExitUsage);
  EXPECT_THAT(p.err, HasSubstr("--max-file-watch-instances 0: must be at least 1"));
  p = parse({"--max-file-watches", "many"}, node);
  EXPECT_EQ(p.parsed.exit_code, kExitUsage);
  EXPECT_THAT(p.err, HasSubstr("--max-file-watches"));
}

}  // namespace
}  // namespace siphon::agent::files
