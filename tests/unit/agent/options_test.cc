// siphon-agent's command line (agent/options.h): what each flag sets, the
// defaults, and the message and exit code of each usage error.
#include "agent/options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace siphon::agent {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// One parse, with what it wrote.
struct Outcome {
  ParsedOptions parsed;
  std::string out, err;
};

Outcome parse(std::vector<std::string> args, const char* env_token = nullptr) {
  args.insert(args.begin(), "siphon-agent");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  Outcome o;
  o.parsed = parseOptions(static_cast<int>(argv.size()), argv.data(), env_token, out, err);
  o.out = out.str();
  o.err = err.str();
  return o;
}

std::ostream& operator<<(std::ostream& os, const Outcome& o) {
  return os << "exit " << o.parsed.exit_code << "\n--- out\n" << o.out << "--- err\n" << o.err;
}

// A scratch directory for token files, removed at the end.
class TempFiles {
 public:
  TempFiles() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "agent-options-XXXXXX").string();
    EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  ~TempFiles() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string file(const std::string& name, const std::string& content) const {
    std::string p = dir_ + "/" + name;
    std::ofstream(p) << content;
    return p;
  }

 private:
  std::string dir_;
};

TEST(AgentOptions, DefaultsOfATargetlessAgent) {
  Outcome o = parse({"targetless", "--insecure-no-auth"});
  ASSERT_TRUE(o.parsed.options) << o;
  EXPECT_EQ(o.parsed.exit_code, kExitOk);
  EXPECT_EQ(o.out, "");
  EXPECT_EQ(o.err, "");
  const AgentOptions& a = *o.parsed.options;
  const AgentConfig defaults;
  EXPECT_EQ(a.mode, TargetMode::kTargetless);
  EXPECT_EQ(a.log_format, log::Format::kText);
  EXPECT_EQ(a.log_level, "info");
  EXPECT_FALSE(a.keep_capabilities);
  EXPECT_FALSE(a.container_id);
  EXPECT_EQ(a.config.listen, "0.0.0.0:7140");
  EXPECT_TRUE(a.config.insecure_no_auth);
  EXPECT_EQ(a.config.token, "");
  EXPECT_EQ(a.config.first_client_timeout, 30s);
  EXPECT_EQ(a.config.idle_timeout, 0s);
  EXPECT_EQ(a.config.limits.session_grace, 60s);
  EXPECT_EQ(a.config.drain_timeout, 25s);
  EXPECT_EQ(a.config.handshake_timeout, 10s);
  EXPECT_EQ(a.config.handshake_first_bytes_timeout, 2s);
  EXPECT_EQ(a.config.limits.keepalive_interval, 5s);
  EXPECT_EQ(a.config.limits.keepalive_timeout, 20s);
  EXPECT_EQ(a.config.http_detect_timeout, 500ms);
  EXPECT_EQ(a.config.http_idle_timeout, 60s);
  EXPECT_EQ(a.config.max_handshakes, defaults.max_handshakes);
  EXPECT_EQ(a.config.max_handshakes_per_source, defaults.max_handshakes_per_source);
  EXPECT_EQ(a.config.max_sessions, defaults.max_sessions);
  EXPECT_EQ(a.config.limits.max_frame_size, defaults.limits.max_frame_size);
  EXPECT_EQ(a.config.limits.replay_buffer_bytes, defaults.limits.replay_buffer_bytes);
  EXPECT_EQ(a.config.limits.max_read_size,
            defaults.limits.max_frame_size - protocol::kReadSizeHeadroom);
  EXPECT_EQ(a.config.mirror_ring_bytes, defaults.mirror_ring_bytes);
  EXPECT_EQ(a.config.mirror_buffer_bytes, defaults.mirror_buffer_bytes);
  EXPECT_EQ(a.config.http_max_head_bytes, defaults.http_max_head_bytes);
  EXPECT_EQ(a.config.http_max_request_body, 0u);
  EXPECT_EQ(a.config.http_max_response_body, 0u);
  EXPECT_EQ(a.config.fs_mode, FsMode::kReadOnly);
  EXPECT_EQ(a.config.fs_identity, FsIdentity::kTarget);
  EXPECT_EQ(a.config.fs_helper_exe, "/proc/self/exe");
  EXPECT_EQ(a.config.steal_backend, "auto");
  EXPECT_EQ(a.config.iptables_mode, "auto");
}

TEST(AgentOptions, FlagsSetTheirFieldsInTheirUnits) {
  // Global flags may come before or after the mode.
  Outcome o = parse({"--listen",
                     "127.0.0.1:0",
                     "targetless",
                     "--insecure-no-auth",
                     "--log-format",
                     "json",
                     "--log-level",
                     "debug",
                     "--idle-timeout",
                     "2m",
                     "--max-frame-size",
                     "64",
                     "--max-session-buffer",
                     "512",
                     "--mirror-ring-size",
                     "64",
                     "--mirror-buffer",
                     "128",
                     "--http-max-head",
                     "8",
                     "--http-max-request-body",
                     "3",
                     "--http-max-response-body",
                     "5",
                     "--fs-mode",
                     "rw",
                     "--fs-identity",
                     "root",
                     "--steal-backend",
                     "iptables",
                     "--iptables",
                     "legacy",
                     "--keep-capabilities",
                     "--max-sessions",
                     "7"});
  ASSERT_TRUE(o.parsed.options) << o;
  const AgentOptions& a = *o.parsed.options;
  EXPECT_EQ(a.config.listen, "127.0.0.1:0");
  EXPECT_EQ(a.log_format, log::Format::kJson);
  EXPECT_EQ(a.log_level, "debug");
  EXPECT_EQ(a.config.idle_timeout, 120s);
  EXPECT_EQ(a.config.limits.max_frame_size, 64u * 1024);
  // --max-read-size follows --max-frame-size unless given.
  EXPECT_EQ(a.config.limits.max_read_size, 64u * 1024 - protocol::kReadSizeHeadroom);
  EXPECT_EQ(a.config.limits.replay_buffer_bytes, 512u * 1024);
  EXPECT_EQ(a.config.mirror_ring_bytes, 64u * 1024);
  EXPECT_EQ(a.config.mirror_buffer_bytes, 128u * 1024);
  EXPECT_EQ(a.config.http_max_head_bytes, 8u * 1024);
  EXPECT_EQ(a.config.http_max_request_body, 3u << 20);
  EXPECT_EQ(a.config.http_max_response_body, 5u << 20);
  EXPECT_EQ(a.config.fs_mode, FsMode::kReadWrite);
  EXPECT_EQ(a.config.fs_identity, FsIdentity::kRoot);
  EXPECT_EQ(a.config.steal_backend, "iptables");
  EXPECT_EQ(a.config.iptables_mode, "legacy");
  EXPECT_TRUE(a.keep_capabilities);
  EXPECT_EQ(a.config.max_sessions, 7u);

  Outcome read = parse({"targetless", "--insecure-no-auth", "--max-read-size", "16"});
  ASSERT_TRUE(read.parsed.options) << read;
  EXPECT_EQ(read.parsed.options->config.limits.max_read_size, 16u * 1024);

  Outcome first_bytes =
      parse({"targetless", "--insecure-no-auth", "--handshake-first-bytes-timeout", "750ms"});
  ASSERT_TRUE(first_bytes.parsed.options) << first_bytes;
  EXPECT_EQ(first_bytes.parsed.options->config.handshake_first_bytes_timeout, 750ms);
}

TEST(AgentOptions, Modes) {
  Outcome pid = parse({"--insecure-no-auth", "targeted", "--pid", "42"});
  ASSERT_TRUE(pid.parsed.options) << pid;
  EXPECT_EQ(pid.parsed.options->mode, TargetMode::kTargeted);
  EXPECT_EQ(pid.parsed.options->pid, 42);
  EXPECT_FALSE(pid.parsed.options->container_id);

  Outcome cid =
      parse({"--insecure-no-auth", "targeted", "--container-id", "containerd://abc", "--runtime",
             "docker", "--runtime-endpoint", "/run/d.sock", "--containerd-namespace", "ns1"});
  ASSERT_TRUE(cid.parsed.options) << cid;
  const AgentOptions& c = *cid.parsed.options;
  EXPECT_EQ(c.mode, TargetMode::kTargeted);
  ASSERT_TRUE(c.container_id);
  EXPECT_EQ(*c.container_id, "containerd://abc");
  EXPECT_EQ(c.runtime_options.runtime, runtime::RuntimeKind::kDocker);
  EXPECT_EQ(c.runtime_options.endpoint, "/run/d.sock");
  EXPECT_EQ(c.runtime_options.containerd_namespace, "ns1");

  Outcome any = parse({"--insecure-no-auth", "targeted", "--container-id", "abc"});
  ASSERT_TRUE(any.parsed.options) << any;
  EXPECT_FALSE(any.parsed.options->runtime_options.runtime) << "--runtime auto";
  EXPECT_EQ(any.parsed.options->runtime_options.containerd_namespace, "k8s.io");

  Outcome eph = parse({"--insecure-no-auth", "ephemeral", "--container-id", "app"});
  ASSERT_TRUE(eph.parsed.options) << eph;
  EXPECT_EQ(eph.parsed.options->mode, TargetMode::kEphemeral);
  EXPECT_EQ(eph.parsed.options->ephemeral_container_id, "app");
  EXPECT_FALSE(eph.parsed.options->container_id);
}

TEST(AgentOptions, TokenFromTheFileOrTheEnvironment) {
  TempFiles files;
  const std::string file = files.file("token", "from-file \n\n");
  Outcome f = parse({"targetless", "--token-file", file}, "from-env");
  ASSERT_TRUE(f.parsed.options) << f;
  EXPECT_EQ(f.parsed.options->config.token, "from-file") << "trailing blanks are not the token";

  Outcome e = parse({"targetless"}, "from-env");
  ASSERT_TRUE(e.parsed.options) << e;
  EXPECT_EQ(e.parsed.options->config.token, "from-env");
  EXPECT_FALSE(e.parsed.options->config.insecure_no_auth);
}

TEST(AgentOptions, HelpAndVersionExitZeroOnStdout) {
  Outcome help = parse({"--help"});
  EXPECT_FALSE(help.parsed.options);
  EXPECT_EQ(help.parsed.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("siphon-agent: lets a remote session act as if it ran inside"));
  for (const char* flag : {"--listen", "--token-file", "--max-sessions", "--handshake-timeout",
                           "--fs-mode", "--steal-backend", "--mirror-ring-size",
                           "--http-detect-timeout", "targeted", "ephemeral", "targetless"}) {
    EXPECT_THAT(help.out, HasSubstr(flag));
  }
  EXPECT_EQ(help.err, "");

  Outcome targeted = parse({"targeted", "--help"});
  EXPECT_EQ(targeted.parsed.exit_code, 0);
  EXPECT_THAT(targeted.out, HasSubstr("--container-id"));
  EXPECT_THAT(targeted.out, HasSubstr("--containerd-namespace"));

  Outcome version = parse({"--version"});
  EXPECT_FALSE(version.parsed.options);
  EXPECT_EQ(version.parsed.exit_code, 0);
  EXPECT_THAT(version.out, HasSubstr(SIPHON_VERSION));
}

struct BadInput {
  std::vector<std::string> args;
  std::string message;  // what stderr must say
};

// Every usage error: exit 2, nothing to start, its message on stderr.
TEST(AgentOptions, BadInputExitsTwoWithItsMessage) {
  TempFiles files;
  const std::string empty_token = files.file("empty", " \n");
  const std::vector<BadInput> cases = {
      {{}, "A subcommand is required"},
      {{"nosuchmode"}, "A subcommand is required"},  // CLI11 takes it for a stray mode
      {{"targetless", "--insecure-no-auth", "--no-such-flag"}, "--no-such-flag"},
      {{"targetless"},
       "refusing to start without client authentication: give --token-file PATH or "
       "SIPHON_TOKEN, or --insecure-no-auth"},
      {{"targetless", "--token-file", "/nonexistent/token"},
       "read --token-file /nonexistent/token"},
      {{"targetless", "--token-file", empty_token}, "--token-file " + empty_token + " is empty"},
      {{"targetless", "--insecure-no-auth", "--log-format", "xml"}, "unknown log format 'xml'"},
      {{"targetless", "--insecure-no-auth", "--log-level", "loud"}, "unknown log level 'loud'"},
      {{"targetless", "--insecure-no-auth", "--idle-timeout", "soon"}, "soon"},
      {{"targetless", "--insecure-no-auth", "--handshake-timeout", "0s"},
       "siphon-agent: --handshake-timeout 0s: must be positive"},
      {{"targetless", "--insecure-no-auth", "--handshake-first-bytes-timeout", "0s"},
       "siphon-agent: --handshake-first-bytes-timeout 0s: must be positive"},
      {{"targetless", "--insecure-no-auth", "--handshake-first-bytes-timeout", "2x"},
       "siphon-agent: --handshake-first-bytes-timeout 2x: bad duration '2x'"},
      {{"targetless", "--insecure-no-auth", "--max-handshakes", "0"},
       "--max-handshakes: Value 0 not in range"},
      {{"targetless", "--insecure-no-auth", "--max-handshakes", "8", "--max-handshakes-per-source",
        "16"},
       "--max-handshakes-per-source 16: must be at most --max-handshakes (8)"},
      {{"targetless", "--insecure-no-auth", "--http-detect-timeout", "0s"},
       "--http-detect-timeout and --http-idle-timeout must be positive"},
      {{"targetless", "--insecure-no-auth", "--keepalive-interval", "15s"},
       "--keepalive-interval (15000 ms) must be positive and at most half of "
       "--keepalive-timeout (20000 ms)"},
      {{"targetless", "--insecure-no-auth", "--mirror-ring-size", "48"},
       "--mirror-ring-size 48: must be a power of two (KiB)"},
      {{"targetless", "--insecure-no-auth", "--fs-mode", "wx"}, "--fs-mode"},
      {{"targetless", "--insecure-no-auth", "--steal-backend", "nft"}, "--steal-backend"},
      {{"targetless", "--insecure-no-auth", "--max-sessions", "0"},
       "--max-sessions: Value 0 not in range"},
      {{"targetless", "--insecure-no-auth", "--tls-key", "/nonexistent/key.pem"}, "--tls"},
      {{"--insecure-no-auth", "targeted"}, "targeted needs --pid PID or --container-id ID"},
      {{"--insecure-no-auth", "targeted", "--pid", "-3"}, "--pid -3 is not a valid PID"},
      {{"--insecure-no-auth", "targeted", "--pid", "3", "--container-id", "abc"}, "excludes"},
      {{"--insecure-no-auth", "targeted", "--pid", "3", "--runtime", "docker"}, "requires"},
      {{"--insecure-no-auth", "targeted", "--container-id", "abc", "--runtime", "rkt"},
       "--runtime"},
  };
  for (const BadInput& c : cases) {
    Outcome o = parse(c.args);
    EXPECT_FALSE(o.parsed.options) << c.message << "\n" << o;
    EXPECT_EQ(o.parsed.exit_code, kExitUsage) << c.message << "\n" << o;
    EXPECT_THAT(o.err, HasSubstr(c.message)) << o;
    EXPECT_EQ(o.out, "") << c.message;
  }
}

}  // namespace
}  // namespace siphon::agent
