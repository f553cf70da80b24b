#include "agent/dns/resolv_conf.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>

#include "agent/dns/config_text.h"

namespace siphon::agent::dns {
namespace {

// The line without a trailing comment: c-ares ends a line at '#' or ';',
// which glibc only treats as comments in the first column. No name or
// address contains either, so stripping them loses nothing real.
std::string_view stripComment(std::string_view line) {
  size_t at = line.find_first_of("#;");
  return at == std::string_view::npos ? line : line.substr(0, at);
}

// "keyword rest": the rest when `line` starts with `keyword` and a blank.
bool matchKeyword(std::string_view line, std::string_view keyword, std::string_view* rest) {
  if (line.size() <= keyword.size() || line.substr(0, keyword.size()) != keyword ||
      !isBlank(line[keyword.size()])) {
    return false;
  }
  *rest = line.substr(keyword.size() + 1);
  return true;
}

bool parseNameserver(std::string_view word, Nameserver* out) {
  std::string text(word);
  unsigned char buf[sizeof(in6_addr)];
  char normal[INET6_ADDRSTRLEN];
  for (int family : {AF_INET, AF_INET6}) {
    if (inet_pton(family, text.c_str(), buf) == 1 &&
        inet_ntop(family, buf, normal, sizeof(normal)) != nullptr) {
      out->family = family;
      out->address = normal;
      out->port = 53;
      return true;
    }
  }
  return false;
}

// "ndots:3" → 3 when `word` is `name` ':' digits.
bool numericOption(std::string_view word, std::string_view name, int* value) {
  if (word.size() <= name.size() + 1 || word.substr(0, name.size()) != name ||
      word[name.size()] != ':') {
    return false;
  }
  std::string_view digits = word.substr(name.size() + 1);
  int v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec == std::errc::result_out_of_range && end == digits.data() + digits.size()) {
    v = 1 << 30;  // clamped below, as glibc clamps a large value
  } else if (ec != std::errc() || end != digits.data() + digits.size() || v < 0) {
    return false;
  }
  *value = v;
  return true;
}

void applyOptions(std::string_view rest, ResolvConf* conf) {
  for (std::string_view w : words(rest)) {
    int v = 0;
    if (numericOption(w, "ndots", &v)) {
      conf->ndots = std::min(v, ResolvConf::kMaxNdots);
    } else if (numericOption(w, "timeout", &v)) {
      conf->timeout_ms = std::clamp(v, 1, ResolvConf::kMaxTimeoutS) * 1000;
    } else if (numericOption(w, "attempts", &v)) {
      conf->attempts = std::clamp(v, 1, ResolvConf::kMaxAttempts);
    } else if (w == "rotate") {
      conf->rotate = true;
    } else if (w == "use-vc" || w == "usevc" || w == "tcp") {
      conf->use_vc = true;
    } else if (w == "edns0") {
      conf->edns0 = true;
    }
    // Everything else (single-request, inet6, trust-ad...) does not change
    // which answer the target gets.
  }
}

}  // namespace

ResolvConf defaultResolvConf() {
  ResolvConf conf;
  conf.nameservers.push_back({AF_INET, "127.0.0.1", 53});
  return conf;
}

ResolvConf parseResolvConf(std::string_view text) {
  ResolvConf conf;
  for (std::string_view line : lines(text)) {
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    line = stripComment(line);

    std::string_view rest;
    if (matchKeyword(line, "nameserver", &rest)) {
      auto w = words(rest);
      Nameserver ns;
      if (!w.empty() && conf.nameservers.size() < ResolvConf::kMaxNameservers &&
          parseNameserver(w[0], &ns)) {
        conf.nameservers.push_back(std::move(ns));
      }
    } else if (matchKeyword(line, "domain", &rest)) {
      auto w = words(rest);
      if (!w.empty()) conf.search.assign(1, std::string(w[0]));
    } else if (matchKeyword(line, "search", &rest)) {
      auto w = words(rest);
      if (!w.empty()) conf.search.assign(w.begin(), w.end());
    } else if (matchKeyword(line, "options", &rest)) {
      applyOptions(rest, &conf);
    }
    // sortlist, lookup and anything unknown: skipped.
  }
  if (conf.nameservers.empty()) conf.nameservers = defaultResolvConf().nameservers;
  return conf;
}

}  // namespace siphon::agent::dns
