// The per-project config file (cli/project_config.h): found upwards, keys by
// the flags' names, flags win, errors name the file, line and key.
#include "cli/project_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace siphon::cli {
namespace {

struct App {
  CLI::App app{"test", "siphon"};
  std::string target;
  std::string ns;
  std::vector<int> ports;
  std::vector<std::string> headers;
  bool json = false;
  std::string timeout = "10s";
  CLI::App* steal = nullptr;
  CLI::App* fs_mount = nullptr;
  std::string mount_dir;
  App() {
    app.fallthrough();
    app.add_option("--target", target);
    app.add_option("-n,--namespace", ns);
    app.add_flag("--json", json);
    app.add_option("--timeout", timeout);
    steal = app.add_subcommand("steal");
    steal->add_option("-p,--port", ports)->check(CLI::Range(1, 65535));
    steal->add_option("--filter-header", headers);
    auto* fs = app.add_subcommand("fs");
    fs_mount = fs->add_subcommand("mount");
    fs_mount->add_option("--dir", mount_dir);
  }
  void parse(std::vector<std::string> args) {
    std::reverse(args.begin(), args.end());
    app.parse(args);
  }
};

absl::Status apply(App& a, const std::string& text) {
  auto c = parseProjectConfig(text, "/p/.siphon.json");
  if (!c.ok()) return c.status();
  return applyProjectConfig(*c, a.app);
}

TEST(ProjectConfig, TopLevelAndTheRunningCommandsSection) {
  App a;
  a.parse({"steal"});
  absl::Status s = apply(a, R"({
  "target": "deploy/web", "namespace": "shop", "json": true,
  "steal": {"port": [8080, 9090], "filter-header": ["x-user: ^me$"]},
  "fs": {"mount": {"dir": "/mnt/pod"}}
})");
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(a.target, "deploy/web");
  EXPECT_EQ(a.ns, "shop");
  EXPECT_TRUE(a.json);
  EXPECT_EQ(a.ports, (std::vector<int>{8080, 9090}));
  EXPECT_EQ(a.headers, (std::vector<std::string>{"x-user: ^me$"}));
  EXPECT_EQ(a.mount_dir, "");  // fs mount does not run
}

TEST(ProjectConfig, FlagsWin) {
  App a;
  a.parse({"--target", "pod/x", "steal", "-p", "7000"});
  ASSERT_TRUE(
      apply(a, R"({"target": "deploy/web", "timeout": "3s", "steal": {"port": [8080]}})").ok());
  EXPECT_EQ(a.target, "pod/x");
  EXPECT_EQ(a.timeout, "3s");
  EXPECT_EQ(a.ports, (std::vector<int>{7000}));
}

TEST(ProjectConfig, AnUnknownKeyNamesFileLineAndKey) {
  App a;
  a.parse({"steal"});
  absl::Status s = apply(a, "{\n  \"target\": \"deploy/web\",\n  \"tagret\": \"x\"\n}\n");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "/p/.siphon.json:3: key 'tagret': no such option of siphon");
  s = apply(a, "{\n  \"steal\": {\n\n    \"prot\": 1\n  }\n}\n");
  EXPECT_EQ(s.message(), "/p/.siphon.json:4: key 'prot': no such option of siphon steal");
  s = apply(a, "{\"stael\": {\"port\": 1}}");
  EXPECT_EQ(s.message(),
            "/p/.siphon.json:1: key 'port' is in \"stael\", which is no command of siphon");
}

TEST(ProjectConfig, ABadValueNamesFileLineAndKey) {
  App a;
  a.parse({"steal"});
  absl::Status s = apply(a, "{\n  \"steal\": {\"port\": [70000]}\n}");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("/p/.siphon.json:2: key 'port': "), std::string::npos) << s;
  EXPECT_NE(s.message().find("70000"), std::string::npos) << s;
  s = apply(a, "{\"target\": {\"x\": 1}}");
  EXPECT_FALSE(s.ok());
  s = apply(a, "{\"target\": [{\"a\": 1}]}");
  EXPECT_NE(s.message().find(":1: key 'target': a value must be"), std::string::npos) << s;
  auto bad = parseProjectConfig("{\n \"target\": \n}", "/p/.siphon.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("/p/.siphon.json: not JSON: parse error at line 3"),
            std::string::npos)
      << bad.status();
  EXPECT_FALSE(parseProjectConfig("[1]", "x").ok());
}

TEST(ProjectConfig, FoundInTheNearestDirectoryAbove) {
  namespace fs = std::filesystem;
  fs::path root = fs::temp_directory_path() / ("siphon-config-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "a" / "b" / "c");
  std::ofstream(root / "a" / kProjectConfigName) << "{}";
  EXPECT_EQ(findProjectConfig((root / "a" / "b" / "c").string()),
            (root / "a" / kProjectConfigName).string());
  std::ofstream(root / "a" / "b" / kProjectConfigName) << "{}";
  EXPECT_EQ(findProjectConfig((root / "a" / "b" / "c").string()),
            (root / "a" / "b" / kProjectConfigName).string());
  fs::remove_all(root);
}

}  // namespace
}  // namespace siphon::cli
