// A Kubectl (layer-protocol/kube/kubectl.h) that answers from a script: each
// rule matches calls whose arguments start with its words (a "*" matches any
// one word, "stem*" a word starting with stem) and answers with a result, the same every time or
// the next of a sequence. Every call is recorded, so a test can say what was asked and what was
// created. A call no rule matches fails the test.
#pragma once

#include <gtest/gtest.h>

#include <deque>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "kube/kubectl.h"

namespace siphon::fakes {

class FakeKubectl : public kube::Kubectl {
 public:
  struct Call {
    std::vector<std::string> args;
    std::string input;
    std::string text() const { return absl::StrJoin(args, " "); }
  };

  // Answers calls starting with `prefix` (words separated by spaces; "*"
  // matches any word, "stem*" one starting with stem). Later rules win over earlier ones.
  void on(const std::string& prefix, kube::KubectlResult result) {
    rules_.push_back({split(prefix), {std::move(result)}});
  }
  // Answers them with `results` in turn; the last one repeats.
  void onSequence(const std::string& prefix, std::vector<kube::KubectlResult> results) {
    rules_.push_back(
        {split(prefix), std::deque<kube::KubectlResult>(results.begin(), results.end())});
  }
  static kube::KubectlResult ok(std::string out) { return {0, std::move(out), ""}; }
  static kube::KubectlResult fail(std::string err, int code = 1) {
    return {code, "", std::move(err)};
  }

  absl::StatusOr<kube::KubectlResult> run(const std::vector<std::string>& args,
                                          std::string_view input = {}) override {
    calls_.push_back({args, std::string(input)});
    for (auto it = rules_.rbegin(); it != rules_.rend(); ++it) {
      if (!matches(it->prefix, args)) continue;
      kube::KubectlResult r = it->results.front();
      if (it->results.size() > 1) it->results.pop_front();
      return r;
    }
    ADD_FAILURE() << "unexpected kubectl call: " << absl::StrJoin(args, " ");
    return kube::KubectlResult{1, "", "error: the fake has no answer"};
  }
  std::vector<std::string> argv(const std::vector<std::string>& args) const override {
    std::vector<std::string> v{"kubectl"};
    v.insert(v.end(), args.begin(), args.end());
    return v;
  }

  const std::vector<Call>& calls() const { return calls_; }
  // The calls whose text starts with `prefix`.
  std::vector<Call> callsStarting(const std::string& prefix) const {
    std::vector<Call> out;
    for (const auto& c : calls_) {
      if (matches(split(prefix), c.args)) out.push_back(c);
    }
    return out;
  }

 private:
  struct Rule {
    std::vector<std::string> prefix;
    std::deque<kube::KubectlResult> results;
  };
  static std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    std::string word;
    for (char c : s) {
      if (c == ' ') {
        if (!word.empty()) out.push_back(word);
        word.clear();
      } else {
        word.push_back(c);
      }
    }
    if (!word.empty()) out.push_back(word);
    return out;
  }
  static bool matches(const std::vector<std::string>& prefix,
                      const std::vector<std::string>& args) {
    if (prefix.size() > args.size()) return false;
    for (size_t i = 0; i < prefix.size(); ++i) {
      const std::string& w = prefix[i];
      if (w == "*" || w == args[i]) continue;
      // "stem*": a word starting with stem.
      if (w.size() > 1 && w.back() == '*' && args[i].rfind(w.substr(0, w.size() - 1), 0) == 0) {
        continue;
      }
      return false;
    }
    return true;
  }

  std::vector<Rule> rules_;
  std::vector<Call> calls_;
};

}  // namespace siphon::fakes
