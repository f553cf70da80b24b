// The pods of a workload (a label selector) or of one pod's name, followed
// as they come and go: a `kubectl get pods --watch --output-watch-events -o
// json` that Siphon supervises, its events handed to a callback.
//
// kubectl lists the pods first (each an ADDED event), then watches from that
// list's resourceVersion, so nothing falls between its list and its watch.
// Watches end (the API server's request timeout, an API error, a kubelet or
// network hiccup): kubectl is started again after a backoff (200 ms,
// doubling to 5 s while it keeps failing). The new one lists every pod again
// as ADDED: the consumer must take events as states, not as changes
// (WorkloadPods does). A pod deleted while no watch ran would never be told
// of: before each restart one `kubectl get pods -o json` lists the pods, and
// every pod known before that is absent from it gets a DELETED (its UID
// will never come back). A pod removed in the instant between that list and
// the new watch's own list is told of by the next restart's list. (Our list
// then `--watch-only` would lose more: kubectl lists again to start its
// watch, and a pod turned Ready between the two lists is never told of.)
//
// kubectl runs as a child that never outlives Siphon (kubectl.h,
// spawnChild). stop() before letting go of it: its coroutines hold it until
// then (and the destructor, when the io_context ends, kills kubectl too).
//
// Threads: the executor it was created on; callbacks run there.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kube/kubectl.h"
#include "kube/target.h"
#include "siphon/transport/asio.h"

namespace siphon::kube {

// Splits a stream of concatenated JSON objects (kubectl's watch events,
// pretty-printed over many lines, one after another) into one text per
// object. Only braces, brackets and strings are followed; whatever lies
// between objects (whitespace) is skipped; the objects are not checked.
class JsonObjectSplitter {
 public:
  // The objects that `data` completes, in order.
  std::vector<std::string> feed(std::string_view data);

 private:
  std::string current_;
  int depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
};

class PodWatch : public std::enable_shared_from_this<PodWatch> {
 public:
  using Argv = std::function<std::vector<std::string>(const std::vector<std::string>&)>;
  struct Options {
    std::string ns;
    std::string selector;  // a label selector (-l), or
    std::string pod;       // one pod's name (--field-selector metadata.name=)
  };

  // `argv` builds kubectl's command line (Kubectl::argv). `on_event` gets
  // every ADDED, MODIFIED and DELETED in order (BOOKMARKs are dropped);
  // `report` a line when kubectl keeps failing (its own error line), and
  // one for an event it cannot read. It starts at once.
  static std::shared_ptr<PodWatch> create(net::asio::any_io_executor ex, Argv argv, Options options,
                                          std::function<void(const PodEvent&)> on_event,
                                          std::function<void(const std::string&)> report = nullptr);
  ~PodWatch();

  // Kills kubectl (SIGTERM to its process group) and starts no other.
  void stop();

  pid_t pidForTest() const { return pid_; }  // the kubectl running, or -1

 private:
  explicit PodWatch(net::asio::any_io_executor ex) : ex_(ex), wake_(ex) {}
  // `get pods` of these pods, -o json; and --watch --output-watch-events.
  std::vector<std::string> args(bool watch) const;
  net::awaitable<void> loop(std::shared_ptr<PodWatch> self);
  // Runs kubectl to its end, its stdout to `out` as it comes (r.out stays
  // empty). exit_code -1: killed by a signal, or its code lost.
  net::awaitable<KubectlResult> run(std::vector<std::string> argv,
                                    std::function<void(std::string_view)> out);
  void onObject(const std::string& text);
  void deliver(const PodEvent& event);

  net::asio::any_io_executor ex_;
  Argv argv_;
  Options options_;
  std::function<void(const PodEvent&)> on_event_;
  std::function<void(const std::string&)> report_;
  std::map<std::string, PodInfo> known_;  // by UID: the pods alive as last told
  std::string event_error_;               // an ERROR event's message, this run
  pid_t pid_ = -1;
  bool stopped_ = false;
  net::Signal wake_;  // stop() during a backoff
};

}  // namespace siphon::kube
