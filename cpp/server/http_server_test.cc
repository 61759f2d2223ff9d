// The socket layer against real sockets on 127.0.0.1: read timeouts that actually let a silent
// client go, and the live WebSocket (auth, events, a slow viewer coalesced then dropped without
// slowing the publisher).
#include "server/http_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <filesystem>
#include <thread>

#include "server/ingest_api.h"

namespace gpuprof::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace asio = boost::asio;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using ::testing::HasSubstr;

// A ServerApi over a fresh SQLite store and an HttpServer serving it on a free port.
class LiveServer {
 public:
  explicit LiveServer(ServerOptions options = {}) {
    dir_ = std::filesystem::temp_directory_path() /
           ("gpuprof_http_" + std::to_string(getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    ApiOptions o;
    o.api_keys = {"k"};
    o.viewer_password = "pw";
    o.secret = std::string(32, 's');
    auto api = ServerApi::Open((dir_ / "server.db").string(), o);
    EXPECT_TRUE(api.ok()) << api.error();
    api_ = std::move(api.value());
    options.port = 0;
    auto http = HttpServer::Listen(options, api_.get());
    EXPECT_TRUE(http.ok()) << http.error();
    http_ = std::move(http.value());
    serving_ = std::thread([this] { http_->Serve(); });
  }
  ~LiveServer() {
    http_->Stop();
    serving_.join();
    std::filesystem::remove_all(dir_);
  }
  uint16_t port() const { return http_->port(); }
  std::string base() const { return "http://127.0.0.1:" + std::to_string(port()); }
  ServerApi& api() { return *api_; }

  // The viewer's session cookies after logging in ("a=1; b=2").
  std::string Login() {
    asio::io_context io;
    beast::tcp_stream stream{io};
    stream.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port()));
    http::request<http::string_body> req{http::verb::post, "/api/v1/login", 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    req.body() = R"({"password": "pw"})";
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> res;
    http::read(stream, buffer, res);
    std::string cookies;
    for (const auto& f : res) {
      if (f.name() != http::field::set_cookie) continue;
      const std::string v(f.value());
      cookies += (cookies.empty() ? "" : "; ") + v.substr(0, v.find(';'));
    }
    return cookies;
  }

 private:
  static inline int counter_ = 0;
  std::filesystem::path dir_;
  std::unique_ptr<ServerApi> api_;
  std::unique_ptr<HttpServer> http_;
  std::thread serving_;
};

// A WebSocket client of /api/v1/live. handshake_status is the server's answer to the upgrade.
struct Viewer {
  asio::io_context io;
  websocket::stream<tcp::socket> ws{io};
  int handshake_status = 0;

  bool Connect(uint16_t port, const std::string& target, const std::string& cookie,
               const std::string& origin = "", int rcvbuf = 0) {
    auto& sock = ws.next_layer();
    sock.open(tcp::v4());
    if (rcvbuf > 0) sock.set_option(asio::socket_base::receive_buffer_size(rcvbuf));
    sock.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    ws.set_option(websocket::stream_base::decorator([cookie, origin](websocket::request_type& r) {
      if (!cookie.empty()) r.set(http::field::cookie, cookie);
      if (!origin.empty()) r.set(http::field::origin, origin);
    }));
    websocket::response_type res;
    beast::error_code ec;
    ws.handshake(res, "127.0.0.1:" + std::to_string(port), target, ec);
    handshake_status = static_cast<int>(res.result_int());
    return !ec;
  }
  nlohmann::json Next() {
    beast::flat_buffer b;
    ws.read(b);
    return nlohmann::json::parse(beast::buffers_to_string(b.data()));
  }
};

// The server's answer to a WebSocket upgrade request for `target` (101 when it accepts).
int UpgradeStatus(uint16_t port, const std::string& target, const std::string& cookie,
                  const std::string& origin = "") {
  asio::io_context io;
  beast::tcp_stream stream{io};
  stream.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "127.0.0.1:" + std::to_string(port));
  req.set(http::field::upgrade, "websocket");
  req.set(http::field::connection, "Upgrade");
  req.set(http::field::sec_websocket_key, "dGhlIHNhbXBsZSBub25jZQ==");
  req.set(http::field::sec_websocket_version, "13");
  if (!cookie.empty()) req.set(http::field::cookie, cookie);
  if (!origin.empty()) req.set(http::field::origin, origin);
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.skip(false);
  beast::error_code ec;
  http::read_header(stream, buffer, parser, ec);
  return ec ? -1 : static_cast<int>(parser.get().result_int());
}

HttpResponse Put(const std::string& base, const std::string& path, const std::string& body,
                 const char* method = "PUT") {
  auto r = HttpCall(base, method, path, {{"X-API-Key", "k"}, {"Content-Type", "application/json"}},
                    body);
  EXPECT_TRUE(r.ok()) << r.error();
  HttpResponse out;
  if (r.ok()) {
    out.status = r->status;
    out.body = r->body;
  }
  return out;
}

constexpr const char* kRun =
    R"({"run": {"run_name": "live", "hostname": "h", "pid": 1, "start_unix_ns": 1,)"
    R"( "start_mono_ns": 0, "status": "running", "gpuprof_version": "0.1.0"}})";

TEST(HttpServerTest, ASilentClientIsLetGoAfterTheReadTimeout) {
  ServerOptions o;
  o.read_timeout_s = 1;
  LiveServer server(o);
  // GIVEN a client that connects and sends nothing
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server.port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  // THEN the server closes it after about the timeout (not never)
  const auto t0 = std::chrono::steady_clock::now();
  char c;
  EXPECT_EQ(::recv(fd, &c, 1, 0), 0);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.8);
  EXPECT_LT(waited, 5.0);
  ::close(fd);
}

TEST(HttpServerTest, AViewerGetsRunsAndBatchesAsTheyAreStored) {
  LiveServer server;
  Viewer v;
  ASSERT_TRUE(v.Connect(server.port(), "/api/v1/live", server.Login()));
  EXPECT_EQ(v.Next()["type"], "hello");
  // WHEN a client creates a run and sends a batch
  EXPECT_EQ(Put(server.base(), "/api/v1/runs/u1", kRun).status, 201);
  const std::string batch =
      R"({"batch_id": "b1", "rows": {"steps": [)"
      R"({"step": 0, "start_ns": 0, "end_ns": 10, "forward_calls": 1, "backward_calls": 1,)"
      R"( "optimizer_calls": 1}, {"step": 1, "start_ns": 10, "end_ns": 20, "forward_calls": 1,)"
      R"( "backward_calls": 1, "optimizer_calls": 1}], "host_samples": [{"ts_ns": 7}]}})";
  EXPECT_EQ(Put(server.base(), "/api/v1/runs/u1/batches", batch, "POST").status, 200);
  // THEN the viewer hears of both, in order
  const nlohmann::json run = v.Next();
  EXPECT_EQ(run["type"], "run");
  EXPECT_EQ(run["run_id"], 1);
  EXPECT_EQ(run["run_name"], "live");
  EXPECT_EQ(run["created"], true);
  const nlohmann::json b = v.Next();
  EXPECT_EQ(b["type"], "batch");
  EXPECT_EQ(b["rows"]["steps"], 2);
  EXPECT_EQ(b["rows"]["host_samples"], 1);
  EXPECT_EQ(b["stored"], 2 + 1);
  EXPECT_EQ(b["last_step"], 1);
  EXPECT_EQ(b["last_ts_ns"], 7);
  // AND a retried batch (stored nothing) is no event; the next one is
  EXPECT_EQ(Put(server.base(), "/api/v1/runs/u1/batches", batch, "POST").status, 200);
  EXPECT_EQ(Put(server.base(), "/api/v1/runs/u1", kRun).status, 200);
  EXPECT_EQ(v.Next()["created"], false);
  EXPECT_EQ(server.api().bus().viewers(), 1u);
}

TEST(HttpServerTest, TheLiveSocketNeedsAViewerFromThisServersOrigin) {
  LiveServer server;
  const std::string cookie = server.Login();
  const uint16_t port = server.port();
  EXPECT_EQ(UpgradeStatus(port, "/api/v1/live", ""), 401);
  EXPECT_EQ(UpgradeStatus(port, "/api/v1/live", "gpuprof_session=v1.9.9.tampered"), 401);
  EXPECT_EQ(UpgradeStatus(port, "/api/v1/live", cookie, "http://evil.example"), 403);
  EXPECT_EQ(UpgradeStatus(port, "/api/v1/live?run=99", cookie), 404);
  EXPECT_EQ(UpgradeStatus(port, "/api/v1/live?run=x", cookie), 400);
  EXPECT_EQ(UpgradeStatus(port, "/api/v1/live", cookie, "http://127.0.0.1:" + std::to_string(port)),
            101);  // the page's own origin
  Viewer v;
  EXPECT_FALSE(v.Connect(port, "/api/v1/live", ""));
  // A plain GET says it is a WebSocket
  auto plain = HttpCall(server.base(), "GET", "/api/v1/live", {{"Cookie", cookie}}, "");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->status, 426);
}

TEST(HttpServerTest, ARunFilterSendsOnlyThatRunsEvents) {
  LiveServer server;
  EXPECT_EQ(Put(server.base(), "/api/v1/runs/a", kRun).status, 201);
  EXPECT_EQ(Put(server.base(), "/api/v1/runs/b", kRun).status, 201);
  Viewer v;
  ASSERT_TRUE(v.Connect(server.port(), "/api/v1/live?run=2", server.Login()));
  EXPECT_EQ(v.Next()["run_id"], 2);  // hello names the filter
  EXPECT_EQ(Put(server.base(), "/api/v1/runs/a", kRun).status, 200);
  EXPECT_EQ(Put(server.base(), "/api/v1/runs/b", kRun).status, 200);
  const nlohmann::json e = v.Next();
  EXPECT_EQ(e["type"], "run");
  EXPECT_EQ(e["run_id"], 2);
}

TEST(HttpServerTest, AViewerThatStopsReadingIsCoalescedThenDroppedAndNeverSlowsIngest) {
  ServerOptions o;
  o.ws_send_timeout_ms = 500;
  LiveServer server(o);
  // GIVEN a viewer with a small receive buffer that never reads
  Viewer slow;
  ASSERT_TRUE(slow.Connect(server.port(), "/api/v1/live", server.Login(), "", 4096));
  LiveBus& bus = server.api().bus();
  for (int i = 0; i < 200 && bus.viewers() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the server subscribes it
  }
  ASSERT_EQ(bus.viewers(), 1u);
  // WHEN events keep coming (large ones, so that the sockets fill)
  const std::string pad(64 * 1024, 'x');
  double slowest_ms = 0;
  for (int i = 0; i < 400 && bus.viewers() > 0; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    bus.PublishBatch(1, {{"rows", {{"steps", 1}}}, {"stored", 1}, {"last_step", i}, {"pad", pad}});
    slowest_ms = std::max(
        slowest_ms,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // THEN publishing never waited on the viewer, later events were merged while it was stuck,
  // and it was dropped after the send timeout
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (bus.viewers() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_LT(slowest_ms, 50.0);
  EXPECT_GT(bus.coalesced(), 0u);
  EXPECT_EQ(bus.dropped(), 1u);
  EXPECT_EQ(bus.viewers(), 0u);
}

TEST(LiveBusTest, PendingEventsOfOneRunMergeIntoOneWithTheirTotals) {
  LiveBus bus;
  auto all = bus.Subscribe(std::nullopt);
  auto one = bus.Subscribe(2);
  bus.PublishRun(1, {{"status", "running"}});
  bus.PublishBatch(1, {{"rows", {{"steps", 2}}}, {"stored", 2}, {"last_step", 5}});
  bus.PublishBatch(1, {{"rows", {{"steps", 1}, {"phases", 3}}},
                       {"stored", 4},
                       {"last_step", 6},
                       {"insights", true}});
  bus.PublishBatch(2, {{"rows", {{"steps", 1}}}, {"stored", 1}, {"last_step", 0}});
  bus.PublishRun(1, {{"status", "ok"}});
  auto events = all->Take(std::chrono::milliseconds(0));
  ASSERT_EQ(events.size(), 3u);          // run 1, batch 1 (merged), batch 2
  EXPECT_EQ(events[0]["status"], "ok");  // the newer run event replaced the older
  EXPECT_EQ(events[1]["rows"]["steps"], 3);
  EXPECT_EQ(events[1]["rows"]["phases"], 3);
  EXPECT_EQ(events[1]["stored"], 6);
  EXPECT_EQ(events[1]["last_step"], 6);
  EXPECT_EQ(events[1]["insights"], true);
  EXPECT_EQ(events[1]["coalesced"], 2);
  EXPECT_EQ(events[2]["run_id"], 2);
  EXPECT_EQ(bus.coalesced(), 2u);  // the second batch and the second run event of run 1
  auto mine = one->Take(std::chrono::milliseconds(0));
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0]["run_id"], 2);
  EXPECT_TRUE(all->Take(std::chrono::milliseconds(10)).empty());
  bus.Unsubscribe(all);
  EXPECT_EQ(bus.viewers(), 1u);
  EXPECT_TRUE(all->closed());
}

}  // namespace
}  // namespace gpuprof::server
