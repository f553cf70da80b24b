#include "agent/dns/hosts_file.h"

#include <algorithm>

#include "agent/dns/config_text.h"

namespace siphon::agent::dns {
HostsFile HostsFile::parse(std::string_view text) {
  HostsFile hosts;
  for (std::string_view line : lines(text)) {
    if (size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);

    std::vector<std::string_view> fields = words(line);
    if (fields.size() < 2) continue;
    auto address = parseIp(fields[0]);
    if (!address) continue;
    Entry entry{*std::move(address), {}};
    for (size_t f = 1; f < fields.size(); ++f) entry.names.emplace_back(fields[f]);
    hosts.entries_.push_back(std::move(entry));
  }
  return hosts;
}

std::optional<HostsFile::Match> HostsFile::lookup(std::string_view name, Family family) const {
  std::optional<Match> match;
  for (const auto& e : entries_) {
    if (!familyAccepts(family, e.address.family)) continue;
    bool named = std::any_of(e.names.begin(), e.names.end(),
                             [&](const std::string& n) { return sameName(n, name); });
    if (!named) continue;
    if (!match) match = Match{e.names.front(), {}};
    if (std::find(match->addresses.begin(), match->addresses.end(), e.address.text) ==
        match->addresses.end()) {
      match->addresses.push_back(e.address.text);
    }
  }
  return match;
}

std::optional<std::vector<std::string>> HostsFile::reverse(const IpAddress& address) const {
  for (const auto& e : entries_) {
    if (e.address.family == address.family && e.address.bytes == address.bytes) return e.names;
  }
  return std::nullopt;
}

}  // namespace siphon::agent::dns
