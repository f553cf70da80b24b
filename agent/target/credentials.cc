#include "agent/target/credentials.h"

#include <grp.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "siphon/status.h"

namespace siphon::agent {
namespace {

std::vector<absl::string_view> fields(absl::string_view rest) {
  return absl::StrSplit(rest, absl::ByAnyChar(" \t"), absl::SkipEmpty());
}

}  // namespace

absl::StatusOr<Credentials> parseProcStatus(std::string_view status) {
  Credentials c;
  int seen = 0;
  for (absl::string_view line : absl::StrSplit(asv(status), '\n')) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    const absl::string_view key = line.substr(0, colon);
    const std::vector<absl::string_view> f = fields(line.substr(colon + 1));
    auto bad = [&] {
      return absl::InvalidArgumentError(absl::StrCat("/proc status: malformed ", key, " line"));
    };
    if (key == "Uid" || key == "Gid") {
      auto& ids = key == "Uid" ? c.uid : c.gid;
      if (f.size() != 4) return bad();
      for (size_t i = 0; i < 4; ++i) {
        if (!absl::SimpleAtoi(f[i], &ids[i])) return bad();
      }
      seen |= key == "Uid" ? 1 : 2;
    } else if (key == "Groups") {
      for (absl::string_view g : f) {
        uint32_t v;
        if (!absl::SimpleAtoi(g, &v)) return bad();
        c.groups.push_back(v);
      }
      seen |= 4;
    } else if (key == "CapInh" || key == "CapPrm" || key == "CapEff") {
      uint64_t v;
      if (f.size() != 1 || !absl::SimpleHexAtoi(f[0], &v)) return bad();
      if (key == "CapInh") c.cap_inheritable = v, seen |= 8;
      if (key == "CapPrm") c.cap_permitted = v, seen |= 16;
      if (key == "CapEff") c.cap_effective = v, seen |= 32;
    }
  }
  if (seen != 63) {
    return absl::InvalidArgumentError(
        "/proc status: a Uid, Gid, Groups, CapInh, CapPrm or CapEff line is missing");
  }
  return c;
}

Credentials ownIdsWithoutCapabilities() {
  Credentials c;
  uid_t r, e, s;
  gid_t gr, ge, gs;
  ::getresuid(&r, &e, &s);
  ::getresgid(&gr, &ge, &gs);
  c.uid = {r, e, s, e};
  c.gid = {gr, ge, gs, ge};
  const int n = ::getgroups(0, nullptr);
  if (n > 0) {
    std::vector<gid_t> g(static_cast<size_t>(n));
    const int got = ::getgroups(n, g.data());
    for (int i = 0; i < got; ++i) c.groups.push_back(g[static_cast<size_t>(i)]);
  }
  return c;
}

}  // namespace siphon::agent
