// A small Prometheus metrics registry: counters and gauges with labels,
// rendered in the text exposition format 0.0.4 (# HELP, # TYPE, one sample
// per line, label values escaped).
//
// Threads: a Counter or Gauge is a relaxed atomic; increment it from any
// thread (the mirror engine has its own). Finding a series by its labels
// takes a mutex: do it once and keep the reference (series are never
// removed, so references stay valid for the registry's lifetime). Collectors
// and render() run on the scraping thread (the event loop).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace siphon::agent::metrics {

enum class Type { kCounter, kGauge };

// One time series' value. Counters only go up (add()); gauges are set.
class Series {
 public:
  void add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  void set(uint64_t v) { value_.store(v, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A sample computed at scrape time (sessions by state, process RSS...).
struct Sample {
  std::vector<std::string> label_values;
  double value = 0;
};

class Registry {
 public:
  // Declares a metric family. `name` must match [a-zA-Z_:][a-zA-Z0-9_:]*,
  // label names [a-zA-Z_][a-zA-Z0-9_]*; declaring a name twice aborts (a
  // programming error).
  void declare(std::string name, Type type, std::string help,
               std::vector<std::string> label_names = {});
  // A family whose samples a function computes at every scrape.
  void declareCollected(std::string name, Type type, std::string help,
                        std::vector<std::string> label_names,
                        std::function<std::vector<Sample>()> collect);

  // The series of family `name` with these label values (as many as its
  // label names), created at 0 on first use. Aborts on an undeclared name.
  Series& series(std::string_view name, const std::vector<std::string>& label_values = {});

  // The whole registry in text format 0.0.4, families in declaration order,
  // series sorted by label values.
  std::string render() const;

  // Content-Type of render()'s output.
  static constexpr std::string_view kContentType = "text/plain; version=0.0.4; charset=utf-8";

 private:
  struct Family {
    std::string name;
    Type type;
    std::string help;
    std::vector<std::string> label_names;
    std::function<std::vector<Sample>()> collect;  // empty: stored series
    std::map<std::vector<std::string>, std::unique_ptr<Series>> series;
  };
  Family& add(std::string name, Type type, std::string help, std::vector<std::string> labels);

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Family>> families_;
  std::map<std::string, Family*, std::less<>> by_name_;
};

// Escaping of the text format: label values escape \ " and newline; HELP
// text escapes \ and newline.
std::string escapeLabelValue(std::string_view v);
std::string escapeHelp(std::string_view v);
// A sample value as the format writes it ("3", "0.25", "+Inf", "NaN").
std::string formatValue(double v);

}  // namespace siphon::agent::metrics
