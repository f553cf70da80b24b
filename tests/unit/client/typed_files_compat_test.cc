// The typed file API against an agent that predates a field (a scripted
// agent answering as the older one did): Directory::nextBatchPlus against
// one that ignores FileReaddir.with_stat, Files::list against one that
// ignores FileOpendir.read_entries. No root.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "siphon/client/files.h"
#include "siphon/client/target.h"
#include "tests/fakes/run_coroutine.h"
#include "tests/fakes/scripted_agent.h"

namespace siphon::client {
namespace {

namespace asio = net::asio;
using fakes::ScriptedAgent;

template <typename F>
void run(F body) {
  fakes::runCoroutine(std::move(body));
}

// A scripted agent serving on `ex`; its on_request answers with answer().
std::shared_ptr<ScriptedAgent> servingAgent(asio::any_io_executor ex) {
  auto agent = std::make_shared<ScriptedAgent>(ex);
  asio::co_spawn(
      ex, [agent]() { return agent->serve(); }, asio::detached);
  return agent;
}

void answer(ScriptedAgent& agent, v1::Response response) {
  agent.session().sendResponse(std::move(response));
  agent.wake();
}

// A Target on the agent alone, without reconnecting.
Target targetOf(asio::any_io_executor ex, const ScriptedAgent& agent) {
  TargetOptions o;
  o.endpoints = {agent.address()};
  o.reconnect = false;
  return Target::create(ex, o);
}

TEST(TypedFilesCompatTest, ReaddirPlusFromAnAgentWithoutStatsGivesEntriesWithoutStat) {
  run([](asio::any_io_executor ex) -> net::awaitable<void> {
    auto agent = servingAgent(ex);
    bool asked_with_stat = false;
    agent->on_request = [&](v1::Request r) {
      v1::Response response;
      response.set_request_id(r.request_id());
      const v1::FileRequest& f = r.file();
      if (f.has_opendir()) {
        response.mutable_file()->mutable_opened()->set_fd(1);
      } else if (f.has_readdir()) {
        // The older agent: with_stat is an unknown field to it, and its
        // entries carry name, ino and type only.
        asked_with_stat = f.readdir().with_stat();
        auto* entries = response.mutable_file()->mutable_entries();
        for (const char* name : {".", "..", "f"}) {
          v1::DirEntry* e = entries->add_entries();
          e->set_name(name);
          e->set_ino(7);
          e->set_type(8);
        }
        entries->set_eof(true);
      } else {
        response.mutable_file()->mutable_done();
      }
      answer(*agent, std::move(response));
    };

    Target target = targetOf(ex, *agent);
    EXPECT_TRUE((co_await target.connect()).ok());
    Files files(target);
    auto dir = co_await files.openDirectory("/d");
    EXPECT_TRUE(dir.ok()) << dir.status();
    if (!dir.ok()) co_return;
    auto batch = co_await dir->nextBatchPlus();
    EXPECT_TRUE(batch.ok()) << batch.status();
    EXPECT_TRUE(asked_with_stat);
    EXPECT_EQ(batch.ok() ? batch->entries.size() : 0u, 3u);
    if (batch.ok() && batch->entries.size() == 3u) {
      EXPECT_TRUE(batch->eof);
      for (const DirEntry& e : batch->entries) EXPECT_FALSE(e.stat.has_value()) << e.name;
      EXPECT_EQ(batch->entries[2].name, "f");
      EXPECT_EQ(batch->entries[2].ino, 7u);
    }
    target.close();
    agent->close();
  });
}

// Files::list against an agent that predates FileOpendir.read_entries: it
// answers the handle alone, and list() reads the batches and closes it.
TEST(TypedFilesCompatTest, ListFromAnAgentWithoutOpendirEntriesReadsBatchesAndCloses) {
  run([](asio::any_io_executor ex) -> net::awaitable<void> {
    auto agent = servingAgent(ex);
    int readdirs = 0;
    bool closed = false;
    agent->on_request = [&](v1::Request r) {
      v1::Response response;
      response.set_request_id(r.request_id());
      const v1::FileRequest& f = r.file();
      if (f.has_opendir()) {
        EXPECT_GT(f.opendir().read_entries(), 0u);
        EXPECT_TRUE(f.opendir().close_at_eof());
        response.mutable_file()->mutable_opened()->set_fd(9);  // nothing else: older agent
      } else if (f.has_readdir()) {
        EXPECT_EQ(f.readdir().dir(), 9u);
        auto* entries = response.mutable_file()->mutable_entries();
        v1::DirEntry* e = entries->add_entries();
        e->set_name(readdirs == 0 ? "first" : "second");
        e->mutable_stat()->set_size(readdirs == 0 ? 1 : 2);
        entries->set_eof(readdirs == 1);
        ++readdirs;
      } else if (f.has_closedir()) {
        closed = f.closedir().dir() == 9u;
        response.mutable_file()->mutable_done();
      }
      answer(*agent, std::move(response));
    };

    Target target = targetOf(ex, *agent);
    EXPECT_TRUE((co_await target.connect()).ok());
    Files files(target);
    auto all = co_await files.list("/d", true);
    EXPECT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(all.ok() ? all->size() : 0u, 2u);
    if (all.ok() && all->size() == 2u) {
      EXPECT_EQ((*all)[0].name, "first");
      EXPECT_EQ((*all)[1].name, "second");
      EXPECT_EQ((*all)[1].stat ? (*all)[1].stat->size : -1, 2);
    }
    EXPECT_EQ(readdirs, 2);
    EXPECT_TRUE(closed) << "the handle was closed";
    target.close();
    agent->close();
  });
}

}  // namespace
}  // namespace siphon::client
