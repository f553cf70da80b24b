// A real HTTP/1.1 server on a unix socket (Boost.Beast), answering the way
// Docker Engine or CRI-O would, for the runtime clients' tests: real bytes
// on a real socket, no runtime needed. It runs on its own thread; replies are
// scripted per request target; requests are recorded.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace siphon::agent::runtime::testing {

class FakeHttpServer {
 public:
  struct Reply {
    unsigned status = 200;
    std::string content_type = "application/json";
    std::string body;
    bool chunked = false;  // Transfer-Encoding: chunked instead of Content-Length
    bool hang = false;     // read the request, never answer
    bool raw = false;      // send `body` as the raw bytes of the answer, then close
  };
  struct Request {
    std::string method;
    std::string target;
    std::string host;
  };

  // Listens on `socket_path` at once; serves from a thread until destroyed.
  explicit FakeHttpServer(std::string socket_path)
      : acceptor_(io_, Protocol::endpoint(socket_path)) {
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~FakeHttpServer() {
    boost::asio::post(io_, [this] {
      boost::system::error_code ignored;
      acceptor_.close(ignored);
      for (auto& s : hung_) s->close(ignored);
      io_.stop();
    });
    thread_.join();
  }

  // Replies to GET `target` with `reply`; an unscripted target gets 404.
  void on(const std::string& target, Reply reply) {
    std::lock_guard<std::mutex> lock(mu_);
    replies_[target] = std::move(reply);
  }
  std::vector<Request> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  using Protocol = boost::asio::local::stream_protocol;

  struct Conn {
    explicit Conn(Protocol::socket s) : socket(std::move(s)) {}
    Protocol::socket socket;
    boost::beast::flat_buffer buffer;
    boost::beast::http::request<boost::beast::http::string_body> request;
    boost::beast::http::response<boost::beast::http::string_body> response;
    std::string raw;
  };

  void accept() {
    acceptor_.async_accept([this](const boost::system::error_code& ec, Protocol::socket s) {
      if (ec) return;
      serve(std::make_shared<Conn>(std::move(s)));
      accept();
    });
  }

  void serve(std::shared_ptr<Conn> c) {
    namespace http = boost::beast::http;
    http::async_read(
        c->socket, c->buffer, c->request, [this, c](const boost::system::error_code& ec, size_t) {
          if (ec) return;
          Reply reply;
          {
            std::lock_guard<std::mutex> lock(mu_);
            requests_.push_back({std::string(c->request.method_string()),
                                 std::string(c->request.target()),
                                 std::string(c->request[http::field::host])});
            auto it = replies_.find(std::string(c->request.target()));
            if (it != replies_.end()) {
              reply = it->second;
            } else {
              reply.status = 404;
              reply.content_type = "text/plain; charset=utf-8";
              reply.body = "404 page not found\n";
            }
          }
          if (reply.hang) {
            hung_.push_back(std::shared_ptr<Protocol::socket>(c, &c->socket));
            return;
          }
          if (reply.raw) {
            c->raw = reply.body;
            boost::asio::async_write(c->socket, boost::asio::buffer(c->raw),
                                     [c](const boost::system::error_code&, size_t) {
                                       boost::system::error_code ignored;
                                       c->socket.close(ignored);
                                     });
            return;
          }
          c->response.result(reply.status);
          c->response.version(11);
          c->response.set(http::field::content_type, reply.content_type);
          c->response.set(http::field::connection, "close");
          c->response.body() = reply.body;
          if (reply.chunked) {
            c->response.chunked(true);
          } else {
            c->response.prepare_payload();
          }
          http::async_write(c->socket, c->response, [c](const boost::system::error_code&, size_t) {
            boost::system::error_code ignored;
            c->socket.shutdown(Protocol::socket::shutdown_send, ignored);
            c->socket.close(ignored);
          });
        });
  }

  boost::asio::io_context io_;
  Protocol::acceptor acceptor_;
  std::thread thread_;
  std::mutex mu_;
  std::map<std::string, Reply> replies_;
  std::vector<Request> requests_;
  std::vector<std::shared_ptr<Protocol::socket>> hung_;  // io thread only
};

}  // namespace siphon::agent::runtime::testing
