#include "agent/capture/filter_compiler.h"

#include <pcap/pcap.h>

#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "siphon/status.h"

namespace siphon::agent::capture {

namespace asio = net::asio;

CompiledFilter::CompiledFilter(std::string expression, std::unique_ptr<bpf_program> program)
    : expression_(std::move(expression)), program_(std::move(program)) {}

CompiledFilter::CompiledFilter(std::string expression) : expression_(std::move(expression)) {}

CompiledFilter::~CompiledFilter() {
  if (program_) pcap_freecode(program_.get());
}

CompiledFilterOr compilePcapFilter(const std::string& expression, int dlt, uint32_t snaplen) {
  struct PcapClose {
    void operator()(pcap_t* p) const { pcap_close(p); }
  };
  std::unique_ptr<pcap_t, PcapClose> dead(pcap_open_dead(dlt, static_cast<int>(snaplen)));
  if (!dead) {
    return protoError(v1::INTERNAL, absl::StrCat("capture filter: libpcap has no handle for link "
                                                 "type ",
                                                 dlt));
  }
  auto program = std::make_unique<bpf_program>();
  *program = bpf_program{};
  if (pcap_compile(dead.get(), program.get(), expression.c_str(), /*optimize=*/1,
                   PCAP_NETMASK_UNKNOWN) != 0) {
    return protoError(v1::INVALID_ARGUMENT,
                      absl::StrCat("capture filter '", expression, "': ", pcap_geterr(dead.get())));
  }
  return std::make_shared<const CompiledFilter>(expression, std::move(program));
}

// What the compile threads share with the compiler: the count of compiles
// running.
struct FilterCompiler::Shared {
  std::mutex mu;
  size_t running = 0;
};

namespace {

// One compile's hand-over. `waiting` is cleared when the coroutine's frame
// goes (it took the result, gave up at the deadline, or was destroyed with
// its event loop): from then on the thread must not touch the event loop,
// which may be gone. The thread posts while holding `mu`, so the frame
// cannot go, nor its event loop with it, during the post.
struct Job {
  std::mutex mu;
  bool waiting = true;
};

struct Abandon {
  std::shared_ptr<Job> job;
  ~Abandon() {
    std::lock_guard<std::mutex> l(job->mu);
    job->waiting = false;
  }
};

}  // namespace

FilterCompiler::FilterCompiler(FilterCompileFunction compile, std::chrono::milliseconds deadline,
                               size_t max_running)
    : compile_(std::move(compile)),
      deadline_(deadline),
      max_running_(max_running),
      shared_(std::make_shared<Shared>()) {}

FilterCompiler::~FilterCompiler() = default;

size_t FilterCompiler::runningForTest() const {
  std::lock_guard<std::mutex> l(shared_->mu);
  return shared_->running;
}

net::awaitable<CompiledFilterOr> FilterCompiler::compile(std::string expression_in, int dlt,
                                                         uint32_t snaplen) {
  const std::string expression = std::move(expression_in);
  {
    std::lock_guard<std::mutex> l(shared_->mu);
    if (shared_->running >= max_running_) {
      co_return protoError(v1::RESOURCE_EXHAUSTED,
                           absl::StrCat("capture filter: ", max_running_,
                                        " filters are compiling on this agent already; try again "
                                        "later"));
    }
    ++shared_->running;
  }
  auto ex = co_await asio::this_coro::executor;
  // The wait: the result, or the deadline. Owned by this frame; the thread
  // reaches it through a weak_ptr, on the event loop.
  struct Wait {
    explicit Wait(asio::any_io_executor e) : signal(e) {}
    net::Signal signal;
    std::optional<CompiledFilterOr> result;
  };
  auto wait = std::make_shared<Wait>(ex);
  std::weak_ptr<Wait> weak = wait;
  const Abandon abandon{std::make_shared<Job>()};
  try {
    std::thread([compile = compile_, shared = shared_, job = abandon.job, ex, weak, expression, dlt,
                 snaplen] {
      CompiledFilterOr result = compile(expression, dlt, snaplen);
      {
        std::lock_guard<std::mutex> l(shared->mu);
        --shared->running;
      }
      std::lock_guard<std::mutex> l(job->mu);
      if (!job->waiting) return;
      asio::post(ex, [weak, result = std::move(result)]() mutable {
        if (auto w = weak.lock()) {
          w->result = std::move(result);
          w->signal.notify();
        }
      });
    }).detach();
  } catch (const std::system_error& e) {
    std::lock_guard<std::mutex> l(shared_->mu);
    --shared_->running;
    co_return protoError(v1::RESOURCE_EXHAUSTED,
                         absl::StrCat("capture filter: no thread to compile it: ", e.what()));
  }
  co_await wait->signal.wait(asio::steady_timer::clock_type::now() + deadline_);
  if (wait->result) co_return *std::move(wait->result);
  co_return protoError(
      v1::TIMEOUT,
      absl::StrCat("capture filter '", expression.substr(0, 200),
                   expression.size() > 200 ? "...'" : "'", ": did not compile within ",
                   std::chrono::duration_cast<std::chrono::milliseconds>(deadline_).count(),
                   " ms (the agent's limit); use a simpler expression"));
}

}  // namespace siphon::agent::capture
