#include "server/webhook.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cstdio>
#include <future>
#include <memory>
#include <thread>

#include "analysis/format.h"

namespace gpuprof::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using nlohmann::json;

// One line of at most max_bytes (a newline and what follows becomes " …"), cut at a UTF-8
// character boundary.
std::string Clip(const std::string& text, size_t max_bytes) {
  std::string line = text.substr(0, text.find('\n'));
  const bool more = line.size() < text.size();
  if (line.size() > max_bytes) {
    size_t cut = max_bytes;
    while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;
    line = line.substr(0, cut) + "…";
  } else if (more) {
    line += " …";
  }
  return line;
}

std::string Where(const WebhookUrl& u) {
  return std::string(u.tls ? "https://" : "http://") + u.host + ":" + u.port;
}

struct Answer {
  int status = 0;
  std::string body;
};

template <class Stream>
Answer Exchange(Stream& stream, const WebhookUrl& u, const std::string& body) {
  http::request<http::string_body> req{http::verb::post, u.target, 11};
  req.set(http::field::host, u.host);
  req.set(http::field::user_agent, "gpuprof");
  req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(1u << 20);
  http::read(stream, buffer, parser);
  return Answer{static_cast<int>(parser.get().result_int()), parser.get().body()};
}

// One attempt; throws on connection / TLS / protocol errors.
Answer Attempt(const WebhookUrl& u, const std::string& body, int timeout_ms) {
  asio::io_context io;
  tcp::resolver resolver{io};
  const auto deadline = std::chrono::milliseconds(timeout_ms);
  const auto endpoints = resolver.resolve(u.host, u.port);
  if (!u.tls) {
    beast::tcp_stream stream{io};
    stream.expires_after(deadline);
    stream.connect(endpoints);
    Answer a = Exchange(stream, u, body);
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    return a;
  }
  ssl::context ctx{ssl::context::tls_client};
  ctx.set_default_verify_paths();  // honours $SSL_CERT_FILE / $SSL_CERT_DIR
  ctx.set_verify_mode(ssl::verify_peer);
  beast::ssl_stream<beast::tcp_stream> stream{io, ctx};
  if (!SSL_set_tlsext_host_name(stream.native_handle(), u.host.c_str())) {
    throw std::runtime_error("cannot set the TLS server name");
  }
  stream.set_verify_callback(ssl::host_name_verification(u.host));
  beast::get_lowest_layer(stream).expires_after(deadline);
  beast::get_lowest_layer(stream).connect(endpoints);
  stream.handshake(ssl::stream_base::client);
  Answer a = Exchange(stream, u, body);
  beast::error_code ec;
  stream.shutdown(ec);  // a peer that closes without close_notify is fine here
  return a;
}

Status Send(const WebhookUrl& u, const std::string& body, const WebhookOptions& o) {
  std::string last;
  for (int i = 0; i < std::max(1, o.attempts); ++i) {
    try {
      const Answer a = Attempt(u, body, o.attempt_timeout_ms);
      if (a.status >= 200 && a.status < 300) return Status::Ok();
      last = Where(u) + " answered " + std::to_string(a.status) +
             (a.body.empty() ? "" : ": " + Clip(a.body, 200));
      if (a.status < 500 && a.status != 429) break;  // the request itself is refused: final
    } catch (const std::exception& e) {
      last = "cannot reach " + Where(u) + ": " + e.what();
    }
  }
  return Status::Error("webhook not delivered: " + last);
}

}  // namespace

Expected<WebhookUrl> ParseWebhookUrl(const std::string& url) {
  WebhookUrl u;
  std::string rest;
  if (url.rfind("https://", 0) == 0) {
    u.tls = true;
    rest = url.substr(8);
  } else if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else {
    return Status::Error("webhook must be an http:// or https:// URL");
  }
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  u.target = slash == std::string::npos ? "/" : rest.substr(slash);
  if (authority.find('@') != std::string::npos) {
    return Status::Error("webhook URL must not carry user:password@");
  }
  u.port = u.tls ? "443" : "80";
  if (!authority.empty() && authority.front() == '[') {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == std::string::npos) return Status::Error("webhook URL has an unclosed '['");
    u.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return Status::Error("webhook URL: bad host");
      u.port = authority.substr(close + 2);
    }
  } else if (const size_t colon = authority.rfind(':'); colon != std::string::npos) {
    u.host = authority.substr(0, colon);
    u.port = authority.substr(colon + 1);
  } else {
    u.host = authority;
  }
  if (u.host.empty()) return Status::Error("webhook URL has no host");
  if (u.port.empty() || u.port.size() > 5 ||
      u.port.find_first_not_of("0123456789") != std::string::npos || std::stoi(u.port) == 0 ||
      std::stoi(u.port) > 65535) {
    return Status::Error("webhook URL has a bad port '" + u.port + "'");
  }
  for (char c : u.target) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) {
      return Status::Error("webhook URL's path holds a space or control character");
    }
  }
  return u;
}

json WebhookMessage(const analysis::Report& report,
                    const std::optional<std::string>& dashboard_url) {
  using analysis::FormatDuration;
  const analysis::RunView& v = report.view;
  const store::RunInfo& run = v.run();
  std::string text = "*gpuprof* · `" + Clip(run.run_name, 120) + "` (run " +
                     std::to_string(run.run_id) + ") ended *" + run.status + "*";
  if (v.duration_ns) text += " after " + FormatDuration(static_cast<double>(*v.duration_ns));
  if (run.error) text += "\n> " + Clip(*run.error, 300);
  text += "\n" + analysis::Plural(v.all ? static_cast<size_t>(v.all->count) : 0, "step", "steps");
  if (v.all) text += ", " + FormatDuration(v.all->mean_ns) + " per step on average";
  text += " · " + (report.mfu.mfu ? "MFU " + analysis::FormatPercent(report.mfu.mfu->value, 1)
                                  : "MFU unknown");
  if (report.insights.empty()) {
    text += "\nNo insight fired.";
  } else {
    const size_t n = std::min(report.insights.size(), kWebhookTopInsights);
    text += "\n*Top insight" + std::string(n == 1 ? "" : "s") + "*";
    for (size_t i = 0; i < n; ++i) {
      const analysis::Insight& in = report.insights[i];
      std::string sev(analysis::SeverityName(in.severity));
      for (char& c : sev) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      text += "\n• [" + sev + "] " + Clip(in.message, 400);
      if (!in.fix.empty()) text += "\n    → " + Clip(in.fix, 400);
    }
    if (report.insights.size() > n) {
      text += "\n(" + std::to_string(report.insights.size() - n) + " more: `gpuprof insights " +
              std::to_string(run.run_id) + "`)";
    }
  }
  if (dashboard_url) text += "\n<" + *dashboard_url + "|Open the run's dashboard>";
  return json{{"text", text}};
}

Status PostWebhook(const std::string& url, const std::string& body, const WebhookOptions& options) {
  auto u = ParseWebhookUrl(url);
  if (!u) return u.status();
  auto task = std::make_shared<std::packaged_task<Status()>>(
      [parsed = *u, body, options] { return Send(parsed, body, options); });
  std::future<Status> done = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  if (done.wait_for(std::chrono::milliseconds(options.budget_ms)) != std::future_status::ready) {
    char budget[32];
    std::snprintf(budget, sizeof budget, "%g s", options.budget_ms / 1000.0);
    return Status::Error("webhook not delivered: " + Where(*u) + " did not answer within " +
                         budget + " (left to finish in the background)");
  }
  return done.get();
}

}  // namespace gpuprof::server
