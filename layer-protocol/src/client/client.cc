// The Client itself: making one, its session's state, close(). The rest of
// the library is split by what it holds (client/link.h says where).
#include "siphon/client/client.h"

#include "client/link.h"
#include "siphon/status.h"

namespace siphon::client {

namespace asio = net::asio;

std::shared_ptr<Client> Client::create(asio::any_io_executor ex, ClientOptions options) {
  return std::shared_ptr<Client>(new Client(std::move(ex), std::move(options)));
}

Client::Client(asio::any_io_executor ex, ClientOptions options)
    : ex_(std::move(ex)), options_(std::move(options)), moved_(ex_) {}

Client::~Client() = default;

const v1::Welcome& Client::welcome() const {
  static const v1::Welcome kNone;
  return link_ ? link_->welcome : kNone;
}

std::string Client::endpoint() const { return link_ ? link_->endpoint : std::string(); }

uint32_t Client::maxReadSize() const {
  return link_ && link_->session ? link_->session->limits().max_read_size
                                 : protocol::SessionLimits().max_read_size;
}

uint64_t Client::resumeCountForTest() const { return link_ ? link_->resumes : 0; }

void Client::close() { closeLinks(std::nullopt); }

std::vector<std::shared_ptr<net::SessionTransport>> Client::closeLinks(
    std::optional<std::chrono::milliseconds> linger) {
  std::vector<std::shared_ptr<net::SessionTransport>> closing;
  if (closing_) return closing;
  closing_ = true;
  std::vector<std::shared_ptr<Link>> links;
  if (link_) links.push_back(link_);
  for (auto& weak : retiring_) {
    if (auto l = weak.lock()) links.push_back(l);
  }
  for (auto& l : replicas_) links.push_back(l);
  for (auto& l : links) {
    if (l->session && l->transport && !l->transport->closed()) {
      l->session->sendGoaway(v1::CANCELLED, "client closed the session");
      if (linger) {
        l->transport->closeAfterFlushAndPeer(*linger);
      } else {
        l->transport->closeAfterFlush();
      }
      closing.push_back(l->transport);
    }
  }
  if (lost_.ok()) sessionLost(protoError(v1::CANCELLED, "client closed the session"));
  return closing;
}

net::awaitable<void> Client::closeAndWait(std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (auto& t : closeLinks(bound)) co_await t->waitClosed(deadline);
}

void Client::cutTransportForTest() {
  if (link_ && link_->transport) link_->transport->close();
}

}  // namespace siphon::client
