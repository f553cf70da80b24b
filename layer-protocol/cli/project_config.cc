#include "cli/project_config.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace siphon::cli {

namespace {

using json = nlohmann::json;

// The line of each key, by its path ("steal/port"): nlohmann's parser keeps
// no positions, so a small scanner walks the text once more (it only needs
// strings, nesting and line breaks; the parser has checked the rest).
std::map<std::string, int> keyLines(const std::string& text) {
  std::map<std::string, int> lines;
  struct Level {
    bool object;
    std::string key;  // the key whose value this level is
  };
  std::vector<Level> stack;
  std::vector<std::string> path;
  int line = 1;
  bool expect_key = false;
  std::string last_key;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
    } else if (c == '"') {
      const int start_line = line;
      std::string s;
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\') ++i;
        if (i < text.size()) s.push_back(text[i]);
        if (i < text.size() && text[i] == '\n') ++line;
      }
      if (expect_key) {
        last_key = s;
        std::vector<std::string> p;
        for (const auto& l : stack) {
          if (!l.key.empty()) p.push_back(l.key);
        }
        p.push_back(s);
        lines[absl::StrJoin(p, "/")] = start_line;
        expect_key = false;
      }
    } else if (c == '{') {
      stack.push_back({true, stack.empty() ? "" : last_key});
      expect_key = true;
    } else if (c == '[') {
      stack.push_back({false, ""});
    } else if (c == '}' || c == ']') {
      if (!stack.empty()) stack.pop_back();
    } else if (c == ',') {
      expect_key = !stack.empty() && stack.back().object;
    } else if (c == ':') {
      // the value follows; a nested object takes last_key as its name
    }
  }
  return lines;
}

std::string scalar(const json& v, bool* ok) {
  *ok = true;
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number()) return v.dump();
  *ok = false;
  return "";
}

absl::Status collect(const json& object, std::vector<std::string> section,
                     const std::map<std::string, int>& lines, const std::string& path,
                     ProjectConfig* out) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    std::vector<std::string> p = section;
    p.push_back(it.key());
    const std::string where = absl::StrJoin(p, "/");
    auto l = lines.find(where);
    const int line = l == lines.end() ? 0 : l->second;
    const json& v = it.value();
    if (v.is_object()) {
      absl::Status s = collect(v, p, lines, path, out);
      if (!s.ok()) return s;
      continue;
    }
    ConfigEntry e;
    e.section = section;
    e.key = it.key();
    e.line = line;
    bool ok = true;
    if (v.is_array()) {
      e.is_list = true;
      for (const auto& item : v) {
        e.values.push_back(scalar(item, &ok));
        if (!ok) break;
      }
    } else if (!v.is_null()) {
      e.values.push_back(scalar(v, &ok));
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line, ": key '", it.key(),
                       "': a value must be a string, a number, a boolean or a list of those"));
    }
    out->entries.push_back(std::move(e));
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<std::string> findProjectConfig(const std::string& dir) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(dir, ec);
  if (ec) return std::nullopt;
  while (true) {
    std::filesystem::path candidate = p / kProjectConfigName;
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return candidate.string();
    if (!p.has_parent_path() || p.parent_path() == p) return std::nullopt;
    p = p.parent_path();
  }
}

absl::StatusOr<ProjectConfig> parseProjectConfig(const std::string& text, const std::string& path) {
  ProjectConfig config;
  config.path = path;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 3, column 5: ..."
    std::string what = e.what();
    const auto at = what.find("parse error");
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not JSON: ", at == std::string::npos ? what : what.substr(at)));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":1: the file must hold one object"));
  }
  absl::Status s = collect(j, {}, keyLines(text), path, &config);
  if (!s.ok()) return s;
  return config;
}

absl::StatusOr<ProjectConfig> loadProjectConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the config file ", path, ": ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return parseProjectConfig(ss.str(), path);
}

absl::Status applyProjectConfig(const ProjectConfig& config, CLI::App& app) {
  for (const auto& e : config.entries) {
    const std::string where = absl::StrCat(config.path, ":", e.line, ": key '", e.key, "'");
    CLI::App* sub = &app;
    std::string command;
    for (const auto& name : e.section) {
      CLI::App* next = nullptr;
      try {
        next = sub->get_subcommand(name);
      } catch (const CLI::Error&) {
        next = nullptr;
      }
      if (next == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            config.path, ":", e.line, ": key '", e.key, "' is in \"", name,
            "\", which is no command of siphon", command.empty() ? "" : " " + command));
      }
      sub = next;
      command += (command.empty() ? "" : " ") + name;
    }
    CLI::Option* opt = sub->get_option_no_throw("--" + e.key);
    if (opt == nullptr || e.key == "help" || e.key == "config") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no such option of siphon", command.empty() ? "" : " " + command));
    }
    // Flags win; a command's section counts only when it runs.
    if (opt->count() > 0) continue;
    if (sub != &app && !sub->parsed()) continue;
    if (e.values.empty()) continue;
    try {
      for (const auto& v : e.values) opt->add_result(v);
      opt->run_callback();
    } catch (const CLI::Error& err) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", err.what()));
    }
  }
  return absl::OkStatus();
}

}  // namespace siphon::cli
