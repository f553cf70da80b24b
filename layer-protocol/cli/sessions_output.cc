#include "cli/sessions_output.h"

#include <algorithm>
#include <array>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/json_writer.h"
#include "cli/output.h"

namespace siphon::cli {

std::string subscriptionText(const client::SessionSubscription& sub) {
  std::string out = absl::StrCat(sub.kind, " ", sub.port);
  if (!sub.filter.empty()) absl::StrAppend(&out, " [", sub.filter, "]");
  if (sub.both_directions) absl::StrAppend(&out, " both");
  return out;
}

std::string sessionsText(const std::vector<client::SessionInfo>& sessions) {
  using Row = std::array<std::string, 9>;
  std::vector<Row> rows;
  rows.push_back({"", "SESSION", "CLIENT", "AGE", "STATE", "STREAMS", "BYTES_IN", "BYTES_OUT",
                  "SUBSCRIPTIONS"});
  for (const client::SessionInfo& s : sessions) {
    std::vector<std::string> subs;
    for (const auto& sub : s.subscriptions) subs.push_back(subscriptionText(sub));
    rows.push_back({s.current ? "*" : "", s.session_id, s.client_name.empty() ? "-" : s.client_name,
                    formatUptime(s.age_ms),
                    s.handovers == 0 ? s.state
                                     : absl::StrCat(s.state, " (", s.handovers,
                                                    s.handovers == 1 ? " handover)" : " handovers)"),
                    absl::StrCat(s.streams),
                    absl::StrCat(s.bytes_in), absl::StrCat(s.bytes_out),
                    subs.empty() ? "-" : absl::StrJoin(subs, ", ")});
  }
  std::array<size_t, 9> width{};
  for (const Row& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const Row& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      if (i + 1 == row.size()) {
        line += row[i];
      } else {
        absl::StrAppend(&line, row[i], std::string(width[i] - row[i].size() + 2, ' '));
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string sessionsJson(const std::vector<client::SessionInfo>& sessions) {
  JsonWriter w;
  w.beginObject();
  w.key("sessions").beginArray();
  for (const client::SessionInfo& s : sessions) {
    w.beginObject();
    w.key("session_id").value(s.session_id);
    w.key("client_name").value(s.client_name);
    w.key("age_ms").value(s.age_ms);
    w.key("state").value(s.state);
    w.key("current").value(s.current);
    w.key("streams").value(s.streams);
    w.key("bytes_in").value(s.bytes_in);
    w.key("bytes_out").value(s.bytes_out);
    w.key("handovers").value(s.handovers);
    w.key("subscriptions").beginArray();
    for (const auto& sub : s.subscriptions) {
      w.beginObject();
      w.key("id").value(sub.id);
      w.key("kind").value(sub.kind);
      w.key("port").value(sub.port);
      w.key("filter").value(sub.filter);
      w.key("backend").value(sub.backend);
      w.key("both_directions").value(sub.both_directions);
      w.endObject();
    }
    w.endArray();
    w.endObject();
  }
  w.endArray();
  w.endObject();
  return w.take();
}

}  // namespace siphon::cli
