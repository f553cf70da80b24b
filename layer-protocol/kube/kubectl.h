// The one way Siphon reaches a Kubernetes cluster: the user's own kubectl.
// Every context, credential plugin (`exec`), client certificate, proxy and
// auth method the user's kubeconfig names works because kubectl does the
// talking; Siphon never reads or stores credentials itself.
//
// Kubectl is a seam: the keeper and the resolver run kubectl through it, the
// tests through a fake that answers from recorded JSON. SystemKubectl runs
// the real binary (`--kubectl PATH`, else `kubectl` on PATH) with the
// user's --context and --kubeconfig in front of every call's arguments.
//
// Threads: a Kubectl is used from one thread at a time; SystemKubectl::run
// blocks (it is called before the session's event loop runs, and after it).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace siphon::kube {

// What one kubectl call did.
struct KubectlResult {
  int exit_code = 0;
  std::string out;
  std::string err;
  bool ok() const { return exit_code == 0; }
};

// Where kubectl is and which cluster it talks to.
struct KubectlOptions {
  std::string binary = "kubectl";  // a name looked up on PATH, or a path
  std::string context;             // --context
  std::string kubeconfig;          // --kubeconfig
  // A call still running after this is killed and fails with
  // DEADLINE_EXCEEDED (a credential plugin waiting for a browser...).
  std::chrono::milliseconds timeout{60000};
};

class Kubectl {
 public:
  virtual ~Kubectl() = default;

  // Runs kubectl with the global arguments, then `args`; `input` on its
  // stdin. A non-zero exit is a result, not an error: the caller reads
  // kubectl's stderr (kubeError()). Errors: NOT_FOUND when kubectl itself
  // cannot be run (kubectlMissing()'s line), DEADLINE_EXCEEDED past the
  // timeout, INTERNAL for a failed fork or pipe.
  virtual absl::StatusOr<KubectlResult> run(const std::vector<std::string>& args,
                                            std::string_view input = {}) = 0;

  // Several calls at once (the `auth can-i` questions): their results in
  // order. The default runs them one after another.
  virtual std::vector<absl::StatusOr<KubectlResult>> runAll(
      const std::vector<std::vector<std::string>>& calls);

  // The whole argv of a long-running kubectl (port-forward, get -w) that the
  // caller starts and supervises itself: the binary, the global arguments,
  // then `args`.
  virtual std::vector<std::string> argv(const std::vector<std::string>& args) const = 0;
};

class SystemKubectl : public Kubectl {
 public:
  explicit SystemKubectl(KubectlOptions options) : options_(std::move(options)) {}
  absl::StatusOr<KubectlResult> run(const std::vector<std::string>& args,
                                    std::string_view input = {}) override;
  std::vector<absl::StatusOr<KubectlResult>> runAll(
      const std::vector<std::vector<std::string>>& calls) override;
  std::vector<std::string> argv(const std::vector<std::string>& args) const override;
  const KubectlOptions& options() const { return options_; }

 private:
  KubectlOptions options_;
};

// A child process of kubectl's, started so that it never outlives Siphon
// and never sees what it must not: its own process group (a Ctrl-C at the
// terminal is Siphon's to handle, not kubectl's), SIGTERM when Siphon dies
// (PR_SET_PDEATHSIG), every descriptor but 0, 1 and 2 closed, stdin from
// /dev/null unless `stdin_fd` is given. `stdout_fd`/`stderr_fd` become its
// 1 and 2. NOT_FOUND (kubectlMissing's line) when the binary cannot be
// executed.
struct SpawnedChild {
  pid_t pid = -1;
  int pidfd = -1;  // owned by the caller; readable once the child exits
};
absl::StatusOr<SpawnedChild> spawnChild(const std::vector<std::string>& argv, int stdin_fd,
                                        int stdout_fd, int stderr_fd);

// Children of spawnChild are reaped by their owner (their exit code is the
// result). A subreaper that reaps its orphans (siphon exec) must leave them
// alone: ownedChild() says whether `pid` is one; releaseChild() after the
// owner reaped it. Threads: any.
bool ownedChild(pid_t pid);
void releaseChild(pid_t pid);

// The line for a kubectl that cannot be run, naming what was tried.
std::string kubectlMissing(const std::string& binary, int err);

// What kubectl said on stderr, as one line: its last "error: ..." or
// "Error from server (...): ..." line, else the last non-empty one.
std::string kubeError(const KubectlResult& r);

// The kind of failure a kubectl call reports (from its stderr).
enum class KubeFailure { kNone, kNotFound, kForbidden, kUnauthorized, kInvalid, kConflict, kOther };
KubeFailure classify(const KubectlResult& r);

}  // namespace siphon::kube
