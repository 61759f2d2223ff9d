// profile(webhook="https://..."): a Slack-compatible message when a run ends.
//
// WebhookMessage builds {"text": ...} (Slack's incoming webhooks, and the Slack-compatible
// endpoints of Mattermost, Rocket.Chat, Discord's /slack) from the run's report: run name and
// id, status (and error), duration, steps, MFU (or why not), the top insights with their
// fixes, and a link to the run's dashboard when one is configured.
//
// PostWebhook sends it: http:// or https:// (OpenSSL; the peer's certificate is verified
// against the system's CAs, or $SSL_CERT_FILE / $SSL_CERT_DIR, with the host name checked).
// One retry after a connection failure, a 5xx or a 429; a 4xx is final. The whole of it runs on
// its own thread and the caller waits at most `budget_ms`: a hung DNS lookup or a slow
// endpoint never holds the program longer (the thread is then left to finish on its own).
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "analysis/report.h"
#include "util/status.h"

namespace gpuprof::server {

inline constexpr size_t kWebhookTopInsights = 3;

nlohmann::json WebhookMessage(const analysis::Report& report,
                              const std::optional<std::string>& dashboard_url);

// "https://host[:port]/path" -> parts; errors name what is wrong with the URL.
struct WebhookUrl {
  bool tls = false;
  std::string host, port, target;
};
Expected<WebhookUrl> ParseWebhookUrl(const std::string& url);

struct WebhookOptions {
  int attempt_timeout_ms = 4000;  // connect + TLS + send + answer, per attempt
  int budget_ms = 10'000;         // what the caller waits in all
  int attempts = 2;
};
// Ok, or what went wrong (the URL's path is left out of messages: it is the secret of a
// Slack webhook).
Status PostWebhook(const std::string& url, const std::string& body,
                   const WebhookOptions& options = {});

}  // namespace gpuprof::server
