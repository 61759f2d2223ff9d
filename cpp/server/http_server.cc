#include "server/http_server.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>
#include <thread>

namespace gpuprof::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

http::response<http::string_body> ToBeast(const HttpResponse& r, unsigned version, bool keep) {
  http::response<http::string_body> res{static_cast<http::status>(r.status), version};
  res.set(http::field::server, "gpuprof");
  res.set(http::field::content_type, r.content_type);
  for (const auto& [k, v] : r.headers) res.insert(k, v);  // insert: Set-Cookie may repeat
  res.keep_alive(keep);
  res.body() = r.body;
  res.prepare_payload();
  return res;
}


}  // namespace

struct HttpServer::Impl {
  ServerOptions options;
  ServerApi* api = nullptr;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::atomic<bool> stopping{false};
  std::atomic<size_t> connections{0};
  std::mutex open_mu;
  std::set<int> open;  // sockets of the live sessions: Stop() shuts them down
  size_t max_body = 0;

  void Session(tcp::socket socket) {
    beast::error_code ec;
    std::string peer;
    {
      auto ep = socket.remote_endpoint(ec);
      if (!ec) peer = ep.address().to_string();
    }
    {
      std::lock_guard lock(open_mu);
      open.insert(socket.native_handle());
    }
    // Reads time out: a client that sends nothing is let go.
    timeval tv{options.read_timeout_s, 0};
    setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    beast::flat_buffer buffer;
    while (!stopping.load()) {
      http::request_parser<http::string_body> parser;
      // The body limit is the API's, plus room for a gzip body's header; the API checks the
      // exact size after inflating.
      parser.body_limit(max_body);
      parser.header_limit(64 * 1024);
      http::read(socket, buffer, parser, ec);
      if (ec == http::error::end_of_stream || ec == asio::error::eof ||
          ec == asio::error::connection_reset) {
        break;
      }
      if (ec) {
        HttpResponse r;
        if (ec == http::error::body_limit) {
          r = ErrorResponse(413, "the body is larger than the server takes (" +
                                 std::to_string(max_body) + " bytes)");
        } else if (ec == asio::error::would_block || ec == asio::error::timed_out ||
                   ec == asio::error::try_again) {
          break;  // idle keep-alive connection or a stalled client
        } else {
          r = ErrorResponse(400, "malformed HTTP request: " + ec.message());
        }
        http::write(socket, ToBeast(r, 11, false), ec);
        if (r.status == 413) {
          // The client is still sending the body it announced: read it away (bounded) so that
          // closing does not reset the connection before it reads the answer.
          socket.shutdown(tcp::socket::shutdown_send, ec);
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          char sink[64 * 1024];
          size_t drained = 0;
          while (drained < (size_t{256} << 20) && std::chrono::steady_clock::now() < until) {
            const size_t n = socket.read_some(asio::buffer(sink), ec);
            if (ec) break;
            drained += n;
          }
        }
        break;
      }
      auto& req = parser.get();
      HttpRequest in;
      in.method = std::string(req.method_string());
      in.target = std::string(req.target());
      for (const auto& field : req) {
        std::string name(field.name_string());
        std::transform(name.begin(), name.end(), name.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        in.headers[name] = std::string(field.value());
      }
      in.body = std::move(req.body());
      in.peer = peer;
      HttpResponse out = api->Handle(in);
      const bool keep = req.keep_alive() && !stopping.load();
      auto res = ToBeast(out, req.version(), keep);
      if (req.method() == http::verb::head) res.body().clear();
      http::write(socket, res, ec);
      if (ec || !keep) break;
    }
    {
      std::lock_guard lock(open_mu);
      open.erase(socket.native_handle());
    }
    socket.shutdown(tcp::socket::shutdown_both, ec);
    socket.close(ec);
  }
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Stop(); }

Expected<std::unique_ptr<HttpServer>> HttpServer::Listen(ServerOptions options, ServerApi* api) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->api = api;
  impl->max_body = api->max_body_bytes();
  beast::error_code ec;
  auto address = asio::ip::make_address(options.host, ec);
  if (ec) {
    return Status::Error("--host '" + options.host + "' is not an IP address (" + ec.message() +
                         ")");
  }
  tcp::endpoint endpoint{address, options.port};
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::Error("cannot listen on " + options.host + ":" + std::to_string(options.port) +
                         ": " + ec.message());
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

uint16_t HttpServer::port() const {
  beast::error_code ec;
  auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? 0 : ep.port();
}

void HttpServer::Serve() {
  Impl* impl = impl_.get();
  while (!impl->stopping.load()) {
    beast::error_code ec;
    tcp::socket socket{impl->io};
    impl->acceptor.accept(socket, ec);
    if (ec) {
      if (impl->stopping.load()) break;
      continue;
    }
    if (impl->connections.load() >= impl->options.max_connections) {
      auto res = ToBeast(ErrorResponse(503, "too many connections; retry later"), 11, false);
      res.set(http::field::retry_after, "1");
      http::write(socket, res, ec);
      socket.close(ec);
      continue;
    }
    impl->connections.fetch_add(1);
    std::thread([impl, s = std::move(socket)]() mutable {
      impl->Session(std::move(s));
      impl->connections.fetch_sub(1);
    }).detach();
  }
  // The sessions were shut down by Stop(); wait for their threads to leave (they touch impl).
  while (impl->connections.load() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  beast::error_code ec;
  impl->acceptor.close(ec);
}

void HttpServer::Stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  beast::error_code ec;
  // Wake the accept() and every session blocked in a read.
  ::shutdown(impl_->acceptor.native_handle(), SHUT_RDWR);
  std::lock_guard lock(impl_->open_mu);
  for (int fd : impl_->open) ::shutdown(fd, SHUT_RDWR);
}

Expected<ClientResponse> HttpCall(const std::string& base_url, const std::string& method,
                                  const std::string& path,
                                  const std::vector<std::pair<std::string, std::string>>& headers,
                                  const std::string& body, int timeout_s) {
  const std::string scheme = "http://";
  if (base_url.rfind(scheme, 0) != 0) {
    return Status::Error("server URL '" + base_url +
                         "' must start with http:// (https is not supported yet)");
  }
  std::string rest = base_url.substr(scheme.size());
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  std::string host = rest, port = "80";
  if (auto colon = rest.rfind(':'); colon != std::string::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty() || rest.find('/') != std::string::npos) {
    return Status::Error("server URL '" + base_url + "' must be http://HOST[:PORT]");
  }
  try {
    asio::io_context io;
    tcp::resolver resolver{io};
    beast::tcp_stream stream{io};
    stream.expires_after(std::chrono::seconds(timeout_s));
    stream.connect(resolver.resolve(host, port));
    http::request<http::string_body> req{http::string_to_verb(method), path, 11};
    req.set(http::field::host, host);
    req.set(http::field::user_agent, "gpuprof");
    for (const auto& [k, v] : headers) req.set(k, v);
    req.body() = body;
    req.prepare_payload();
    stream.expires_after(std::chrono::seconds(timeout_s));
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64u << 20);
    http::read(stream, buffer, parser);
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    ClientResponse out;
    out.status = static_cast<int>(parser.get().result_int());
    out.body = parser.get().body();
    return out;
  } catch (const std::exception& e) {
    return Status::Error("cannot reach " + base_url + ": " + e.what());
  }
}

}  // namespace gpuprof::server
