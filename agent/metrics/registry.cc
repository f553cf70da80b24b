#include "agent/metrics/registry.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace siphon::agent::metrics {

namespace {

bool validName(std::string_view name, bool colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                    (colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

[[noreturn]] void misuse(std::string_view what, std::string_view name) {
  // A metric declared or used wrongly is a bug in the agent, not an
  // operating condition.
  std::fprintf(stderr, "siphon-agent: metrics: %.*s: %.*s\n", static_cast<int>(what.size()),
               what.data(), static_cast<int>(name.size()), name.data());
  std::abort();
}

void appendLabels(std::string& out, const std::vector<std::string>& names,
                  const std::vector<std::string>& values) {
  if (names.empty()) return;
  out += '{';
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    absl::StrAppend(&out, names[i], "=\"", escapeLabelValue(i < values.size() ? values[i] : ""),
                    "\"");
  }
  out += '}';
}

}  // namespace

std::string escapeLabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string escapeHelp(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string formatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Integers (every counter) print exactly, without an exponent.
  if (v == std::floor(v) && std::fabs(v) < 9.0e15) {
    return absl::StrCat(static_cast<int64_t>(v));
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

Registry::Family& Registry::add(std::string name, Type type, std::string help,
                                std::vector<std::string> labels) {
  if (!validName(name, true)) misuse("invalid metric name", name);
  for (const auto& l : labels) {
    if (!validName(l, false) || l.starts_with("__")) misuse("invalid label name", l);
  }
  std::lock_guard lock(mu_);
  if (by_name_.contains(name)) misuse("declared twice", name);
  auto f = std::make_unique<Family>();
  f->name = std::move(name);
  f->type = type;
  f->help = std::move(help);
  f->label_names = std::move(labels);
  Family& ref = *f;
  by_name_[ref.name] = &ref;
  families_.push_back(std::move(f));
  return ref;
}

void Registry::declare(std::string name, Type type, std::string help,
                       std::vector<std::string> label_names) {
  add(std::move(name), type, std::move(help), std::move(label_names));
}

void Registry::declareCollected(std::string name, Type type, std::string help,
                                std::vector<std::string> label_names,
                                std::function<std::vector<Sample>()> collect) {
  Family& f = add(std::move(name), type, std::move(help), std::move(label_names));
  std::lock_guard lock(mu_);
  f.collect = std::move(collect);
}

Series& Registry::series(std::string_view name, const std::vector<std::string>& label_values) {
  std::lock_guard lock(mu_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) misuse("undeclared metric", name);
  Family& f = *it->second;
  if (f.collect) misuse("collected metric has no stored series", name);
  if (label_values.size() != f.label_names.size()) misuse("wrong number of labels for", name);
  auto& slot = f.series[label_values];
  if (!slot) slot = std::make_unique<Series>();
  return *slot;
}

std::string Registry::render() const {
  std::string out;
  std::lock_guard lock(mu_);
  for (const auto& f : families_) {
    absl::StrAppend(&out, "# HELP ", f->name, " ", escapeHelp(f->help), "\n");
    absl::StrAppend(&out, "# TYPE ", f->name, " ", f->type == Type::kCounter ? "counter" : "gauge",
                    "\n");
    if (f->collect) {
      // Collectors compute from the agent's state; they never call back
      // into the registry (the lock is held).
      for (const Sample& s : f->collect()) {
        out += f->name;
        appendLabels(out, f->label_names, s.label_values);
        absl::StrAppend(&out, " ", formatValue(s.value), "\n");
      }
      continue;
    }
    for (const auto& [labels, series] : f->series) {
      out += f->name;
      appendLabels(out, f->label_names, labels);
      absl::StrAppend(&out, " ", series->value(), "\n");
    }
  }
  return out;
}

}  // namespace siphon::agent::metrics
