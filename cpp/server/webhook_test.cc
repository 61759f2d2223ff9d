#include "server/webhook.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <thread>

#include "analysis/test_runs.h"

namespace gpuprof::server {
namespace {

using analysis::testing::kMs;
using analysis::testing::RunBuilder;
using analysis::testing::StepShape;

TEST(WebhookUrl, PartsAndClearErrors) {
  auto u = ParseWebhookUrl("https://hooks.slack.com/services/T0/B0/xyz");
  ASSERT_TRUE(u.ok()) << u.error();
  EXPECT_TRUE(u->tls);
  EXPECT_EQ(u->host, "hooks.slack.com");
  EXPECT_EQ(u->port, "443");
  EXPECT_EQ(u->target, "/services/T0/B0/xyz");
  auto local = ParseWebhookUrl("http://127.0.0.1:8123");
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE(local->tls);
  EXPECT_EQ(local->port, "8123");
  EXPECT_EQ(local->target, "/");
  auto v6 = ParseWebhookUrl("http://[::1]:9/x");
  ASSERT_TRUE(v6.ok()) << v6.error();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(ParseWebhookUrl("ftp://x/y").error(), "webhook must be an http:// or https:// URL");
  EXPECT_NE(ParseWebhookUrl("https://:80/").error().find("no host"), std::string::npos);
  EXPECT_NE(ParseWebhookUrl("http://h:99999/").error().find("bad port"), std::string::npos);
  EXPECT_NE(ParseWebhookUrl("http://u:p@h/").error().find("user:password"), std::string::npos);
  EXPECT_NE(ParseWebhookUrl("http://h/a b").error().find("space"), std::string::npos);
}

TEST(WebhookMessage, SaysHowTheRunEndedWithItsTopInsightsAndFixes) {
  // GIVEN a failed run whose steps wait half their time on the loader
  RunBuilder b;
  b.Name("bert-ft");
  StepShape stall;
  stall.wait_ns = 50 * kMs;
  b.Steps(20, stall);
  b.run().status = "failed";
  b.run().error = "RuntimeError: CUDA out of memory\nTraceback ...";
  const analysis::Report report = analysis::Analyze(b.Build(), analysis::RuleContext{});
  ASSERT_FALSE(report.insights.empty());
  // WHEN the message is built with a dashboard link
  const auto msg = WebhookMessage(report, std::string("http://srv:8000/#/runs/7"));
  const std::string text = msg.at("text").get<std::string>();
  // THEN it names the run, its end and error (first line), its steps and top insights
  EXPECT_NE(text.find("`bert-ft` (run 1) ended *failed*"), std::string::npos) << text;
  EXPECT_NE(text.find("> RuntimeError: CUDA out of memory …"), std::string::npos) << text;
  EXPECT_EQ(text.find("Traceback"), std::string::npos);
  EXPECT_NE(text.find("20 steps"), std::string::npos);
  EXPECT_NE(text.find("• ["), std::string::npos);
  EXPECT_NE(text.find(report.insights[0].message), std::string::npos);
  EXPECT_NE(text.find("→ " + report.insights[0].fix.substr(0, 40)), std::string::npos);
  EXPECT_NE(text.find("<http://srv:8000/#/runs/7|Open the run's dashboard>"), std::string::npos);
  EXPECT_EQ(msg.size(), 1u);  // {"text": ...}: what every Slack-compatible endpoint takes
}

// A one-request-at-a-time HTTP server on 127.0.0.1 answering `statuses` in turn.
class Endpoint {
 public:
  explicit Endpoint(std::vector<int> statuses, int delay_ms = 0)
      : acceptor_(io_, {boost::asio::ip::make_address("127.0.0.1"), 0}),
        statuses_(std::move(statuses)),
        delay_ms_(delay_ms) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Endpoint() {
    // A blocking accept() in the thread is not woken by close(): connect once to end it.
    stop_ = true;
    boost::system::error_code ec;
    boost::asio::io_context io;
    boost::asio::ip::tcp::socket wake(io);
    wake.connect(acceptor_.local_endpoint(), ec);
    thread_.join();
    acceptor_.close(ec);
  }
  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port()) + "/hook";
  }
  std::vector<std::string> bodies;

 private:
  void Run() {
    namespace http = boost::beast::http;
    for (int status : statuses_) {
      boost::asio::ip::tcp::socket socket(io_);
      boost::system::error_code ec;
      acceptor_.accept(socket, ec);
      if (ec || stop_) return;
      boost::beast::flat_buffer buffer;
      http::request<http::string_body> req;
      http::read(socket, buffer, req, ec);
      if (ec) continue;
      bodies.push_back(req.body());
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
      http::response<http::string_body> res{static_cast<http::status>(status), 11};
      res.body() = status == 200 ? "ok" : "no";
      res.prepare_payload();
      http::write(socket, res, ec);
    }
  }
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::vector<int> statuses_;
  int delay_ms_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(PostWebhook, DeliversAndRetriesOnceAfterA5xxButNotAfterA4xx) {
  {
    Endpoint e({200});
    EXPECT_TRUE(PostWebhook(e.url(), R"({"text":"hi"})").ok());
  }
  {
    Endpoint e({503, 200});
    const std::string url = e.url();
    EXPECT_TRUE(PostWebhook(url, R"({"text":"again"})").ok());
  }
  {
    Endpoint e({500, 500, 200});
    const std::string url = e.url();
    const Status st = PostWebhook(url, "{}");
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("answered 500"), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find("/hook"), std::string::npos);  // the path is the secret
  }
  {
    Endpoint e({400, 200});
    const Status st = PostWebhook(e.url(), "{}");
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("answered 400"), std::string::npos);
  }
}

TEST(PostWebhook, ASlowEndpointCostsTheBudgetAtMost) {
  Endpoint e({200}, /*delay_ms=*/1500);
  WebhookOptions o;
  o.budget_ms = 300;
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = PostWebhook(e.url(), "{}", o);
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("did not answer within"), std::string::npos) << st.message();
  EXPECT_LT(waited, std::chrono::milliseconds(1000));
}

}  // namespace
}  // namespace gpuprof::server
