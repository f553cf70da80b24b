// The one FileRequest round trip the typed file calls share (files.cc,
// files_links.cc): through TargetCore::call, so the Target's timeout,
// failover and resume apply.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "client/target_core.h"
#include "siphon/v1/files.pb.h"

namespace siphon::client {

using FileResult = absl::StatusOr<v1::FileResponse>;

// The file answer, or the call's error (an Error{ERRNO} as an errno status).
// `piped`: Client::call's (a read's data may come in a pipe).
net::awaitable<FileResult> fileCall(std::shared_ptr<TargetCore> core, v1::FileRequest f,
                                    std::shared_ptr<protocol::PipedBytes>* piped = nullptr);
// A call whose answer carries nothing (FileDone).
net::awaitable<absl::Status> doneCall(std::shared_ptr<TargetCore> core, v1::FileRequest f);

}  // namespace siphon::client
