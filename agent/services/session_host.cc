#include "agent/services/session_host.h"

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent {

void SessionHost::respondError(uint64_t request_id, const absl::Status& status,
                               std::string_view context) {
  v1::Response r;
  r.set_request_id(request_id);
  *r.mutable_error() = toProtoError(status);
  if (!context.empty()) {
    r.mutable_error()->set_message(absl::StrCat(std::string(context), ": ", r.error().message()));
  }
  respond(std::move(r));
}

void SessionHost::respond(v1::Response response, std::shared_ptr<protocol::PipedBytes> data) {
  auto bytes = data->materialize();
  if (!bytes.ok()) {
    respondError(response.request_id(), bytes.status());
    return;
  }
  response.mutable_file()->mutable_data()->set_data(std::string(*bytes));
  respond(std::move(response));
}

}  // namespace siphon::agent
