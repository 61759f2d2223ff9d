// The socket side of `gpuprof serve`: HTTP/1.1 on Boost.Beast (synchronous, one thread per
// connection up to a cap, keep-alive), each request handed to ServerApi::Handle. Reads time out
// (a silent client never holds a thread), bodies above the API's limit are refused with 413
// before they are read, and a malformed request is a 400, never a crash. GET /api/v1/live
// upgrades to a WebSocket (after ServerApi::AuthorizeLive) that carries the LiveBus's events.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "server/ingest_api.h"
#include "util/status.h"

namespace gpuprof::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0: any free port (port() says which)
  size_t max_connections = 1024;
  int read_timeout_s = 30;              // a request (or a WebSocket handshake) must arrive by then
  int64_t ws_send_timeout_ms = 10'000;  // a viewer that takes no message for this long is dropped
  int64_t ws_ping_ms = 15'000;          // a ping to an idle viewer (finds dead connections)
};

class HttpServer {
 public:
  // Binds and listens; Serve() then accepts until Stop().
  static Expected<std::unique_ptr<HttpServer>> Listen(ServerOptions options, ServerApi* api);
  ~HttpServer();

  uint16_t port() const;
  void Serve();  // blocks until Stop()
  void Stop();   // from any thread (a signal handler's thread included)

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One HTTP request to a gpuprof server, for `gpuprof push` and tests: http://host:port only.
struct ClientResponse {
  int status = 0;
  std::string body;
};
Expected<ClientResponse> HttpCall(const std::string& base_url, const std::string& method,
                                  const std::string& path,
                                  const std::vector<std::pair<std::string, std::string>>& headers,
                                  const std::string& body, int timeout_s = 30);

}  // namespace gpuprof::server
