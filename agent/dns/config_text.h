// Line and word splitting shared by the resolv.conf and hosts parsers: both
// are lines of blank-separated words (blanks: space, tab, CR, FF, VT).
#pragma once

#include <string_view>
#include <vector>

namespace siphon::agent::dns {

inline bool isBlank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

// The lines of `text`, without their '\n'; a last line without one counts.
inline std::vector<std::string_view> lines(std::string_view text) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    out.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

// The blank-separated words of `s`.
inline std::vector<std::string_view> words(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && isBlank(s[i])) ++i;
    size_t start = i;
    while (i < s.size() && !isBlank(s[i])) ++i;
    if (i > start) out.push_back(s.substr(start, i - start));
  }
  return out;
}

}  // namespace siphon::agent::dns
