#include "server/http_server.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace gpuprof::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

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

// The API's view of a request's line and headers (names lower-cased); the body is the caller's.
HttpRequest ToRequest(const http::request<http::string_body>& req, const std::string& peer) {
  HttpRequest in;
  in.method = std::string(req.method_string());
  in.target = std::string(req.target());
  for (const auto& field : req) {
    std::string name(field.name_string());
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    in.headers[name] = std::string(field.value());
  }
  in.peer = peer;
  return in;
}

}  // namespace

struct HttpServer::Impl {
  ServerOptions options;
  ServerApi* api = nullptr;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::atomic<bool> stopping{false};
  std::atomic<size_t> connections{0};
  // The sockets of the live sessions (Stop() shuts them down), each with the time by which its
  // pending read or write must finish (0: none pending). Asio's blocking reads and writes wait
  // past SO_RCVTIMEO / SO_SNDTIMEO, so the reaper thread shuts a socket down when its deadline
  // passes: a silent client or a viewer that stopped reading never holds a thread.
  std::mutex open_mu;
  std::map<int, int64_t> open;
  std::set<int> expired;  // sockets the reaper shut down (guarded by open_mu)
  std::thread reaper;
  size_t max_body = 0;

  void SetDeadline(int fd, int64_t ms_from_now) {
    std::lock_guard lock(open_mu);
    open[fd] = ms_from_now > 0 ? NowMs() + ms_from_now : 0;
  }
  bool Expired(int fd) {
    std::lock_guard lock(open_mu);
    return expired.count(fd) > 0;
  }
  void Reap() {
    while (!stopping.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::lock_guard lock(open_mu);
      const int64_t now = NowMs();
      for (auto& [fd, deadline] : open) {
        if (deadline != 0 && now > deadline) {
          ::shutdown(fd, SHUT_RDWR);
          expired.insert(fd);
          deadline = 0;
        }
      }
    }
  }

  // A viewer's WebSocket (GET /api/v1/live, accepted): sends the bus's events for its filter
  // until the viewer goes, the server stops, or a send outlasts the send timeout (dropped).
  void Live(websocket::stream<tcp::socket&>& ws, int fd, std::optional<int64_t> run_filter) {
    LiveBus& bus = api->bus();
    auto sub = bus.Subscribe(run_filter);
    beast::error_code ec;
    auto send = [&](const std::string& text) {
      SetDeadline(fd, options.ws_send_timeout_ms);
      ws.text(true);
      ws.write(asio::buffer(text), ec);
      SetDeadline(fd, 0);
      return !ec;
    };
    nlohmann::json hello = {{"type", "hello"}, {"api", "v1"}};
    hello["run_id"] = run_filter ? nlohmann::json(*run_filter) : nlohmann::json(nullptr);
    bool ok = send(hello.dump());
    int64_t last_sent = NowMs();
    while (ok && !stopping.load()) {
      std::vector<nlohmann::json> events = sub->Take(std::chrono::milliseconds(500));
      for (const auto& e : events) {
        ok = send(e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
        if (!ok) break;
        last_sent = NowMs();
      }
      if (ok && events.empty() && NowMs() - last_sent > options.ws_ping_ms) {
        SetDeadline(fd, options.ws_send_timeout_ms);
        ws.ping({}, ec);
        SetDeadline(fd, 0);
        ok = !ec;
        last_sent = NowMs();
      }
    }
    if (Expired(fd)) bus.CountDropped();
    bus.Unsubscribe(sub);
  }

  void Session(tcp::socket socket) {
    beast::error_code ec;
    std::string peer;
    {
      auto ep = socket.remote_endpoint(ec);
      if (!ec) peer = ep.address().to_string();
    }
    const int fd = socket.native_handle();
    SetDeadline(fd, 0);
    beast::flat_buffer buffer;
    while (!stopping.load()) {
      http::request_parser<http::string_body> parser;
      // The body limit is the API's, plus room for a gzip body's header; the API checks the
      // exact size after inflating.
      parser.body_limit(max_body);
      parser.header_limit(64 * 1024);
      // Reads time out: a client that sends nothing (or too slowly) is let go.
      SetDeadline(fd, int64_t{options.read_timeout_s} * 1000);
      http::read(socket, buffer, parser, ec);
      SetDeadline(fd, 0);
      if (ec == http::error::end_of_stream || ec == asio::error::eof ||
          ec == asio::error::connection_reset || Expired(fd)) {
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
      if (websocket::is_upgrade(req) && ServerApi::IsLiveTarget(std::string(req.target()))) {
        const HttpRequest in = ToRequest(req, peer);
        std::optional<int64_t> run_filter;
        if (auto refused = api->AuthorizeLive(in, &run_filter)) {
          http::write(socket, ToBeast(*refused, req.version(), false), ec);
          break;
        }
        websocket::stream<tcp::socket&> ws{socket};
        ws.set_option(websocket::stream_base::decorator(
            [](websocket::response_type& res) { res.set(http::field::server, "gpuprof"); }));
        SetDeadline(fd, int64_t{options.read_timeout_s} * 1000);
        ws.accept(req, ec);
        SetDeadline(fd, 0);
        if (!ec) Live(ws, fd, run_filter);
        break;
      }
      HttpRequest in = ToRequest(req, peer);
      in.body = std::move(req.body());
      HttpResponse out = api->Handle(in);
      const bool keep = req.keep_alive() && !stopping.load();
      auto res = ToBeast(out, req.version(), keep);
      if (req.method() == http::verb::head) res.body().clear();
      http::write(socket, res, ec);
      if (ec || !keep) break;
    }
    {
      std::lock_guard lock(open_mu);
      open.erase(fd);
      expired.erase(fd);
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
  impl->reaper = std::thread([impl] { impl->Reap(); });
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
  if (impl->reaper.joinable()) impl->reaper.join();
}

void HttpServer::Stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  beast::error_code ec;
  // Wake the accept() and every session blocked in a read.
  ::shutdown(impl_->acceptor.native_handle(), SHUT_RDWR);
  std::lock_guard lock(impl_->open_mu);
  for (const auto& [fd, deadline] : impl_->open) ::shutdown(fd, SHUT_RDWR);
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
