#include "cli/exec_config.h"

#include <fcntl.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "cli/options.h"
#include "exec/fds.h"
#include "exec/policy.h"

namespace siphon::cli {
namespace {

using google::protobuf::Value;

const char* kindName(const Value& v) {
  switch (v.kind_case()) {
    case Value::kNullValue:
      return "null";
    case Value::kNumberValue:
      return "a number";
    case Value::kStringValue:
      return "a string";
    case Value::kBoolValue:
      return "a boolean";
    case Value::kStructValue:
      return "an object";
    case Value::kListValue:
      return "a list";
    case Value::KIND_NOT_SET:
      break;
  }
  return "empty";
}

absl::Status wrong(const std::string& origin, const std::string& key, const char* want,
                   const Value& v) {
  return absl::InvalidArgumentError(
      absl::StrCat(origin, ": \"", key, "\" is ", kindName(v), ", not ", want));
}

absl::Status takeBool(const std::string& origin, const std::string& key, const Value& v,
                      bool* out) {
  if (v.kind_case() != Value::kBoolValue) return wrong(origin, key, "a boolean", v);
  *out = v.bool_value();
  return absl::OkStatus();
}

absl::Status takeString(const std::string& origin, const std::string& key, const Value& v,
                        std::string* out) {
  if (v.kind_case() != Value::kStringValue) return wrong(origin, key, "a string", v);
  *out = v.string_value();
  return absl::OkStatus();
}

absl::Status takeList(const std::string& origin, const std::string& key, const Value& v,
                      std::vector<std::string>* out) {
  if (v.kind_case() != Value::kListValue) return wrong(origin, key, "a list of strings", v);
  out->clear();
  for (const Value& item : v.list_value().values()) {
    if (item.kind_case() != Value::kStringValue) {
      return wrong(origin, key + "[]", "a string", item);
    }
    out->push_back(item.string_value());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status checkEnvAllow(const std::string& glob) {
  if (glob.empty() || glob.find('=') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--env-allow '", glob, "': a variable's name or a glob (no '=')"));
  }
  // A plain name siphon takes anyway is a mistake (a typo) worth a word.
  if (glob.find_first_of("*?[") == std::string::npos && !exec::choosesCode(glob)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--env-allow ", glob,
        ": the target's value of it is taken without this; --env-allow names a variable that "
        "chooses code run here (LD_PRELOAD, BASH_ENV, ...: docs/EXEC.md)"));
  }
  return absl::OkStatus();
}

absl::Status checkKeptDescriptors(const std::vector<int>& fds) {
  if (fds.size() >= exec::kMaxKeptDescriptors) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keep-fd: at most ", exec::kMaxKeptDescriptors - 1, " descriptors"));
  }
  for (int fd : fds) {
    if (fd < 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("--keep-fd ", fd, ": 0, 1 and 2 are always the program's; N is 3 or more"));
    }
    if (::fcntl(fd, F_GETFD) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--keep-fd ", fd, ": siphon was not given descriptor ", fd, " (e.g. `", fd, "<FILE`)"));
    }
  }
  return absl::OkStatus();
}

void registerExecFlags(CLI::App& exec, ExecFlags& flags) {
  exec.add_option("-f,--config", flags.config_file,
                  "A JSON file with these options by name (\"local\": [...], \"env\": {...}, "
                  "\"command\": [...]); flags given here win");
  exec.add_flag("--remote-loopback", flags.remote_loopback,
                "Send connections to loopback to the target's loopback (a sidecar) instead of "
                "this machine's");
  exec.add_option("--local", flags.local,
                  "CIDR[:PORT] (IPv6 in brackets with a port): connections there are made from "
                  "this machine; repeatable")
      ->allow_extra_args(false);
  exec.add_option("--remote", flags.remote,
                  "CIDR[:PORT]: connections there are made from the target; repeatable (the "
                  "most specific rule wins, a tie goes to --local)")
      ->allow_extra_args(false);
  exec.add_option("--env", flags.env_set,
                  "NAME=VALUE in the program's environment, over both; "
                  "repeatable")
      ->allow_extra_args(false);
  exec.add_option("--env-include", flags.env_include,
                  "Take only the target's variables whose names match this glob; repeatable")
      ->allow_extra_args(false);
  exec.add_option("--env-exclude", flags.env_exclude,
                  "Keep the local value of variables matching this glob; repeatable (PATH, "
                  "HOME, TERM, DISPLAY and SSH_AUTH_SOCK always stay local)")
      ->allow_extra_args(false);
  exec.add_option("--env-allow", flags.env_allow,
                  "Take the target's value of a variable that chooses code run here (LD_PRELOAD, "
                  "BASH_ENV, NODE_OPTIONS, GIT_*...: docs/EXEC.md), left out by default; a name "
                  "or glob, repeatable")
      ->allow_extra_args(false);
  exec.add_option("--keep-fd", flags.keep_fds,
                  "Give the program descriptor N that siphon was given (e.g. `3<file`), at the "
                  "same number; repeatable (by default it gets 0, 1 and 2 only)")
      ->type_name("N")
      ->allow_extra_args(false);
  exec.add_flag("--no-target-env", flags.no_target_env, "Run with the local environment only");
  exec.add_option("--hostname", flags.hostname,
                  "The program's hostname (default: the target's /etc/hostname, else its "
                  "HOSTNAME)");
  exec.add_option("--agent-lost-timeout", flags.agent_lost_timeout,
                  "With no agent left for this long, stop the program (SIGTERM) and exit 3")
      ->capture_default_str();
  exec.add_flag("--no-udp", flags.no_udp,
                "Leave the program's UDP in its own namespace (lookups then go over TCP)");
  exec.add_flag("--local-dns", flags.local_dns,
                "Keep this machine's /etc/resolv.conf and /etc/hosts for the program");
  exec.add_option("--steal", flags.steal,
                  "PORT[:LOCAL]: the target's connections to PORT go to the program's listener "
                  "on LOCAL (default PORT); with --filter-* only the HTTP requests that match; "
                  "repeatable")
      ->allow_extra_args(false);
  exec.add_option("--mirror", flags.mirror,
                  "PORT[:LOCAL]: a copy of the client->server bytes of each connection to the "
                  "target's PORT goes to the program's listener on LOCAL (its answers are "
                  "dropped); repeatable")
      ->allow_extra_args(false);
  exec.add_option("--incoming", flags.incoming,
                  "steal|mirror|off: every port the program listens on is stolen (or mirrored) "
                  "from the target while it listens")
      ->capture_default_str();
  exec.add_option("--fs-remote", flags.fs_remote,
                  "PATH: the target's PATH (a directory or a file) shown at the same path in the "
                  "program's view, through a FUSE mount (siphon fs mount); repeatable")
      ->allow_extra_args(false);
  exec.add_option("--fs-root", flags.fs_root,
                  "DIR: the target's whole root shown at DIR in the program's view");
  exec.add_flag("--fs-ro", flags.fs_ro, "Show --fs-remote and --fs-root read-only");
  exec.add_option("--filter-header", flags.filter.headers,
                  "Steal only HTTP requests with this header and a value the RE2 regex matches "
                  "(as siphon steal); repeatable")
      ->type_name("'NAME: REGEX'")
      ->allow_extra_args(false);
  exec.add_option("--filter-path", flags.filter.path,
                  "Steal only HTTP requests whose path the RE2 regex matches")
      ->type_name("REGEX");
  exec.add_option("--filter-method", flags.filter.method,
                  "Steal only HTTP requests with this method")
      ->type_name("METHOD");
  exec.add_flag("--filter-any", flags.filter.any,
                "A request matching any one filter is stolen (default: all must match)");
  // Everything from the first word that is not an option of exec's is the
  // command and its arguments, taken as they are; siphon's options do not
  // reach into it.
  exec.prefix_command();
  exec.fallthrough(false);
}

std::vector<std::string> splitExecTail(const std::vector<std::string>& args, ExecTail* tail) {
  bool seen_exec = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "exec") seen_exec = true;
    if (args[i] == "--" && seen_exec) {
      tail->present = true;
      tail->words.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      return std::vector<std::string>(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  return args;
}

absl::Status mergeExecConfig(const std::string& json, const std::string& origin,
                             const std::function<bool(const std::string&)>& given,
                             ExecFlags& flags) {
  const size_t first = json.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || json[first] != '{') {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": not a JSON object"));
  }
  google::protobuf::Struct root;
  auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &root);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": malformed JSON: ", std::string(parsed.message())));
  }
  for (const auto& [key, value] : root.fields()) {
    absl::Status s;
    const bool skip = given(key);
    if (key == "remote-loopback") {
      bool v = false;
      s = takeBool(origin, key, value, &v);
      if (s.ok() && !skip) flags.remote_loopback = v;
    } else if (key == "fs-ro") {
      bool v = false;
      s = takeBool(origin, key, value, &v);
      if (s.ok() && !skip) flags.fs_ro = v;
    } else if (key == "fs-root") {
      std::string v;
      s = takeString(origin, key, value, &v);
      if (s.ok() && !skip) flags.fs_root = v;
    } else if (key == "fs-remote") {
      std::vector<std::string> v;
      s = takeList(origin, key, value, &v);
      if (s.ok() && !skip) flags.fs_remote = std::move(v);
    } else if (key == "filter-any") {
      bool v = false;
      s = takeBool(origin, key, value, &v);
      if (s.ok() && !skip) flags.filter.any = v;
    } else if (key == "incoming" || key == "filter-path" || key == "filter-method") {
      std::string v;
      s = takeString(origin, key, value, &v);
      if (s.ok() && !skip) {
        if (key == "incoming") {
          flags.incoming = v;
        } else {
          (key == "filter-path" ? flags.filter.path : flags.filter.method) = v;
        }
      }
    } else if (key == "steal" || key == "mirror" || key == "filter-header") {
      std::vector<std::string> v;
      s = takeList(origin, key, value, &v);
      std::vector<std::string>* out = key == "steal"    ? &flags.steal
                                      : key == "mirror" ? &flags.mirror
                                                        : &flags.filter.headers;
      if (s.ok() && !skip) *out = std::move(v);
    } else if (key == "no-target-env" || key == "no-udp" || key == "local-dns") {
      bool v = false;
      s = takeBool(origin, key, value, &v);
      bool* out = key == "no-target-env" ? &flags.no_target_env
                  : key == "no-udp"      ? &flags.no_udp
                                         : &flags.local_dns;
      if (s.ok() && !skip) *out = v;
    } else if (key == "hostname" || key == "agent-lost-timeout") {
      std::string v;
      s = takeString(origin, key, value, &v);
      if (s.ok() && !skip) (key == "hostname" ? flags.hostname : flags.agent_lost_timeout) = v;
    } else if (key == "local" || key == "remote" || key == "env-include" || key == "env-exclude" ||
               key == "env-allow" || key == "command") {
      std::vector<std::string> v;
      s = takeList(origin, key, value, &v);
      std::vector<std::string>* out = key == "local"         ? &flags.local
                                      : key == "remote"      ? &flags.remote
                                      : key == "env-include" ? &flags.env_include
                                      : key == "env-exclude" ? &flags.env_exclude
                                      : key == "env-allow"   ? &flags.env_allow
                                                             : &flags.command;
      if (s.ok() && !skip) *out = std::move(v);
    } else if (key == "env") {
      // An object of NAME: VALUE, or a list of "NAME=VALUE".
      std::vector<std::string> v;
      if (value.kind_case() == Value::kStructValue) {
        for (const auto& [name, item] : value.struct_value().fields()) {
          if (item.kind_case() != Value::kStringValue) {
            return wrong(origin, "env." + name, "a string", item);
          }
          v.push_back(absl::StrCat(name, "=", item.string_value()));
        }
        std::sort(v.begin(), v.end());
      } else {
        s = takeList(origin, key, value, &v);
      }
      // Flags given add to (and win over) the file's: they come last.
      if (s.ok()) flags.env_set.insert(flags.env_set.begin(), v.begin(), v.end());
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          origin, ": unknown option \"", key,
          "\" (known: local, remote, remote-loopback, env, env-include, env-exclude, "
          "env-allow, no-target-env, hostname, agent-lost-timeout, no-udp, local-dns, steal, "
          "mirror, "
          "incoming, filter-header, filter-path, filter-method, filter-any, fs-remote, fs-root, "
          "fs-ro, command)"));
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status finishExecFlags(ExecFlags& flags, const CLI::App& exec, const ExecTail& tail) {
  // The command: after `--`, or what prefix_command() left.
  std::vector<std::string> rest = exec.remaining();
  if (tail.present) {
    if (!rest.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown option ", rest.front(), " of exec (siphon's own options go before `exec`)"));
    }
    rest = tail.words;
  }
  if (!rest.empty()) flags.command = rest;
  // Before anything of siphon's is opened (the config file, below): a
  // number open now is one siphon was given, never one of its own.
  if (absl::Status s = checkKeptDescriptors(flags.keep_fds); !s.ok()) return s;
  if (!flags.config_file.empty()) {
    std::ifstream in(flags.config_file, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("-f ", flags.config_file, ": cannot read it: ", std::strerror(errno)));
    }
    std::stringstream text;
    text << in.rdbuf();
    auto given = [&exec, &rest](const std::string& key) {
      if (key == "command") return !rest.empty();
      if (key == "env") return false;  // merged, the flags' last
      // An unknown key has no flag: mergeExecConfig() names it.
      const CLI::Option* flag = exec.get_option_no_throw("--" + key);
      return flag != nullptr && flag->count() > 0;
    };
    absl::Status s = mergeExecConfig(text.str(), flags.config_file, given, flags);
    if (!s.ok()) return s;
  }
  if (flags.command.empty()) {
    return absl::InvalidArgumentError("no program to run (siphon exec [OPTIONS] -- COMMAND ...)");
  }
  for (const auto& r : flags.local) {
    if (auto p = exec::parseAddressRule(r, exec::Via::kLocal); !p.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--local: ", p.status().message()));
    }
  }
  for (const auto& r : flags.remote) {
    if (auto p = exec::parseAddressRule(r, exec::Via::kTarget); !p.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--remote: ", p.status().message()));
    }
  }
  for (const auto& e : flags.env_set) {
    if (absl::Status s = exec::checkEnvAssignment(e); !s.ok()) return s;
  }
  for (const auto& glob : flags.env_allow) {
    if (absl::Status s = checkEnvAllow(glob); !s.ok()) return s;
  }
  auto d = parseDuration(flags.agent_lost_timeout);
  if (!d.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--agent-lost-timeout: ", d.status().message()));
  }
  flags.agent_lost_timeout_ms = *d;

  flags.incoming_ports.clear();
  for (bool mirror : {false, true}) {
    for (const auto& text : mirror ? flags.mirror : flags.steal) {
      auto p = parseIncomingPort(text, mirror);
      if (!p.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(mirror ? "--mirror " : "--steal ", p.status().message()));
      }
      for (const IncomingPort& other : flags.incoming_ports) {
        if (other.port == p->port) {
          return absl::InvalidArgumentError(
              absl::StrCat("port ", p->port, " is given twice (--steal/--mirror)"));
        }
      }
      flags.incoming_ports.push_back(*p);
    }
  }
  if (flags.incoming == "off") {
    flags.incoming_mode = IncomingMode::kOff;
  } else if (flags.incoming == "steal") {
    flags.incoming_mode = IncomingMode::kSteal;
  } else if (flags.incoming == "mirror") {
    flags.incoming_mode = IncomingMode::kMirror;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--incoming ", flags.incoming, ": not steal, mirror or off"));
  }
  for (std::string& path : flags.fs_remote) {
    if (path.empty() || path[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("--fs-remote ", path,
                       ": an absolute path (the same in the target and in "
                       "the program's view)"));
    }
    path = std::filesystem::path(path).lexically_normal().string();
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    if (path == "/") {
      return absl::InvalidArgumentError(
          "--fs-remote /: the target's whole root would hide this machine's; use --fs-root DIR");
    }
  }
  if (!flags.fs_root.empty()) {
    std::filesystem::path root = std::filesystem::absolute(flags.fs_root).lexically_normal();
    flags.fs_root = root.string();
    while (flags.fs_root.size() > 1 && flags.fs_root.back() == '/') flags.fs_root.pop_back();
    if (flags.fs_root == "/") {
      return absl::InvalidArgumentError("--fs-root /: name a directory to show the root at");
    }
  }
  auto filter = parseStealFilter(flags.filter);
  if (!filter.ok()) return filter.status();
  flags.http_filter = *std::move(filter);
  const bool steals = flags.incoming_mode == IncomingMode::kSteal ||
                      std::any_of(flags.incoming_ports.begin(), flags.incoming_ports.end(),
                                  [](const IncomingPort& p) { return !p.mirror; });
  if (flags.http_filter && !steals) {
    return absl::InvalidArgumentError(
        "--filter-* applies to stolen ports: add --steal PORT or --incoming steal");
  }
  return absl::OkStatus();
}

absl::StatusOr<IncomingPort> parseIncomingPort(std::string_view text, bool mirror) {
  IncomingPort p;
  p.mirror = mirror;
  const size_t colon = text.find(':');
  const std::string_view port = text.substr(0, colon);
  if (!parsePort(port, &p.port)) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(text), ": \"", std::string(port),
                     "\" is not a port (1-65535); PORT or PORT:LOCAL"));
  }
  p.local = p.port;
  if (colon != std::string_view::npos) {
    const std::string_view local = text.substr(colon + 1);
    if (!parsePort(local, &p.local)) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(text), ": \"", std::string(local),
                       "\" is not a port (1-65535); PORT or PORT:LOCAL"));
    }
  }
  return p;
}

}  // namespace siphon::cli
