// Scripted runtimes for the selection logic: each (runtime, socket) pair
// answers what the test says, every call is recorded, and a pair the test
// did not script answers as a missing socket does.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/runtime/resolver.h"
#include "agent/runtime/runtime_client.h"
#include "siphon/status.h"

namespace siphon::agent::runtime {

class FakeRuntimes {
 public:
  using Answer = std::function<absl::StatusOr<ResolvedContainer>(const std::string& id)>;

  // `kind` at `socket` answers with `answer` from now on.
  void script(RuntimeKind kind, const std::string& socket, Answer answer) {
    answers_[{kind, socket}] = std::move(answer);
  }
  // `kind` at `socket` runs `id` as `pid` with `env` ("NAME=VALUE").
  void runs(RuntimeKind kind, const std::string& socket, const std::string& id, pid_t pid,
            std::vector<std::pair<std::string, std::string>> env = {}) {
    script(kind, socket, [=](const std::string& asked) -> absl::StatusOr<ResolvedContainer> {
      if (asked != id) return notFound(kind, socket, asked);
      ResolvedContainer r;
      r.pid = pid;
      r.runtime = std::string(runtimeName(kind));
      r.container_id = id;
      r.endpoint = socket;
      for (const auto& [name, value] : env) {
        v1::EnvVar& v = r.env.emplace_back();
        v.set_name(name);
        v.set_value(value);
      }
      return r;
    });
  }
  // `kind` at `socket` answers and has no such container.
  void empty(RuntimeKind kind, const std::string& socket) {
    script(kind, socket, [=](const std::string& asked) -> absl::StatusOr<ResolvedContainer> {
      return notFound(kind, socket, asked);
    });
  }
  void fails(RuntimeKind kind, const std::string& socket, absl::Status status) {
    script(kind, socket,
           [status](const std::string&) -> absl::StatusOr<ResolvedContainer> { return status; });
  }

  static absl::Status notFound(RuntimeKind kind, const std::string& socket, const std::string& id) {
    return absl::NotFoundError(absl::StrCat("container ", id, " not found in ",
                                            asv(runtimeName(kind)), " (", socket, ")"));
  }

  RuntimeClientFactory factory() {
    return [this](RuntimeKind kind, const std::string& socket) -> std::unique_ptr<RuntimeClient> {
      return std::make_unique<Client>(this, kind, socket);
    };
  }

  // "containerd /run/containerd/containerd.sock abc" per resolve(), in order.
  const std::vector<std::string>& calls() const { return calls_; }

 private:
  class Client : public RuntimeClient {
   public:
    Client(FakeRuntimes* world, RuntimeKind kind, std::string socket)
        : world_(world), kind_(kind), socket_(std::move(socket)) {}
    RuntimeKind kind() const override { return kind_; }
    const std::string& endpoint() const override { return socket_; }
    absl::StatusOr<ResolvedContainer> resolve(std::string_view id) override {
      world_->calls_.push_back(absl::StrCat(asv(runtimeName(kind_)), " ", socket_, " ", asv(id)));
      auto it = world_->answers_.find({kind_, socket_});
      if (it == world_->answers_.end()) {
        return absl::UnavailableError(
            absl::StrCat(asv(runtimeName(kind_)), " at ", socket_, ": no such socket"));
      }
      return it->second(std::string(id));
    }

   private:
    FakeRuntimes* world_;
    RuntimeKind kind_;
    std::string socket_;
  };

  std::map<std::pair<RuntimeKind, std::string>, Answer> answers_;
  std::vector<std::string> calls_;
};

}  // namespace siphon::agent::runtime
