// `siphon fs mount MOUNTPOINT [--path DIR] [--ro] [--attr-timeout DUR]`: the
// target's files (its root, or DIR inside it) as a local FUSE file system,
// served until SIGINT/SIGTERM or `fusermount3 -u MOUNTPOINT`
// (layer-protocol/fuse/fuse_mount.h).
//
// Output: one line once mounted, "mounted TARGET:DIR at MOUNTPOINT (ro|rw,
// agent ADDR)", or with --json {"event":"mounted",...}. Exit codes: 0 once
// unmounted; 2 for a mountpoint that is missing, not a directory, not empty
// or a mount already (and bad flags); 1 for a DIR that is missing or not a
// directory in the target, or a mount the system refused; 3 when no agent
// answered.
#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/json_writer.h"
#include "cli/long_running.h"
#include "cli/options.h"
#include "fuse/fuse_mount.h"
#include "siphon/client/errors.h"
#include "siphon/client/files.h"

namespace siphon::cli {
namespace {

struct MountFlags {
  std::string mountpoint;
  std::string path = "/";
  bool read_only = false;
  std::string attr_timeout = "1s";
  bool debug = false;
};

std::string mountedLine(const std::string& target, const fuse::MountOptions& o,
                        const std::string& agent, bool json) {
  const char* mode = o.read_only ? "ro" : "rw";
  if (json) {
    return JsonLine("mounted")
        .add("target", target)
        .add("path", o.remote_dir)
        .add("mountpoint", o.mountpoint)
        .add("mode", mode)
        .add("agent", agent)
        .take();
  }
  return absl::StrCat("mounted ", target, ":", o.remote_dir, " at ", o.mountpoint, " (", mode,
                      ", agent ", agent, ")\n");
}

net::awaitable<int> runMount(const CommandEnv& env, std::shared_ptr<MountFlags> f) {
  // "0": no caching at all (every stat asks the agent).
  auto timeout = f->attr_timeout == "0" ? absl::StatusOr<std::chrono::milliseconds>(0)
                                        : parseDuration(f->attr_timeout);
  if (!timeout.ok()) {
    printError(absl::StrCat("fs mount: --attr-timeout: ", timeout.status().message()));
    co_return kExitUsage;
  }
  std::string reclaimed;
  if (absl::Status s = fuse::checkMountpoint(f->mountpoint, &reclaimed); !s.ok()) {
    printError(absl::StrCat("fs mount: ", s.message()));
    co_return kExitUsage;
  }
  if (!reclaimed.empty()) printError(absl::StrCat("fs mount: ", reclaimed));
  fuse::MountOptions o;
  std::error_code ec;
  o.mountpoint = std::filesystem::absolute(f->mountpoint, ec).lexically_normal().string();
  if (o.mountpoint.size() > 1 && o.mountpoint.back() == '/') o.mountpoint.pop_back();
  o.remote_dir = f->path.empty() ? "/" : f->path;
  o.read_only = f->read_only;
  o.attr_timeout = *timeout;
  o.debug = f->debug;

  client::Files files(env.target);
  auto st = co_await files.stat(o.remote_dir);
  if (!st.ok()) co_return reportFailure(absl::StrCat("fs mount --path ", o.remote_dir), st.status());
  if (!st->isDirectory()) {
    printError(absl::StrCat("fs mount: --path ", o.remote_dir, " is not a directory in the target"));
    co_return kExitError;
  }
  std::string target = env.target.endpoint();
  if (auto info = co_await env.target.info(); info.ok() && !info->hostname.empty()) {
    target = info->hostname;
  }

  auto mount = fuse::FuseMount::mount(env.target, o);
  if (!mount.ok()) {
    printError(absl::StrCat("fs mount: ", mount.status().message()));
    co_return mount.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage
                                                                         : kExitError;
  }
  std::unique_ptr<fuse::FuseMount> m = std::move(*mount);
  LongRunning lr(env, "fs mount", LongRunning::toStderr());
  fuse::FuseMount* raw = m.get();
  lr.on_stop = [raw](int) { raw->stop(); };
  lr.on_end = [raw](int) { raw->stop(); };
  lr.start();
  co_await m->watchRoot();
  if (int rc = printOutput(mountedLine(target, o, env.target.endpoint(), env.json)); rc != 0) {
    m->stop();
  }
  // The session lost for good does not end the mount: its operations
  // answer EIO until it is unmounted.
  absl::Status served = co_await m->serve();
  lr.finish();
  m.reset();
  if (!served.ok()) {
    printError(absl::StrCat("fs mount: ", served.message()));
    co_return kExitError;
  }
  co_return kExitOk;
}

}  // namespace

void addFsMountCommand(CLI::App& fs, std::vector<Command>& out) {
  auto f = std::make_shared<MountFlags>();
  CLI::App* c = fs.add_subcommand(
      "mount", "Mount the target's files at MOUNTPOINT (FUSE) until SIGINT/SIGTERM or unmount");
  c->add_option("mountpoint", f->mountpoint, "An empty local directory")->required();
  c->add_option("--path", f->path, "The directory inside the target to mount (default /)");
  c->add_flag("--ro", f->read_only, "Mount read-only");
  c->add_option("--attr-timeout", f->attr_timeout,
                "How long attributes and names are cached (default 1s; 0 for none)");
  c->add_flag("--fuse-debug", f->debug, "libfuse's request log on stderr");
  out.push_back({c, [f](const CommandEnv& env) { return runMount(env, f); }});
}

}  // namespace siphon::cli
