// The `gpuprof` command-line tool.
//
//   gpuprof insights [DB] [RUN] [--json] [--gpu-rate USD]   report of a stored run
//   gpuprof insights [DB] --group NAME [--json]              every rank of a multi-rank run
//                                                            (NAME: group id or run name)
//   gpuprof insights --storage-url URL [RUN | --group NAME]  the same from a server's storage
//   gpuprof rules [--markdown | --reference]                 the rule registry / MFU and
//                                                            cost reference tables
//   gpuprof serve [--host H] [--port P] --api-key K... [--api-key-file F] [--storage-url U]
//                                                            the team server (ingest)
//   gpuprof push [DB] [RUN] --server URL [--api-key K]       send a stored run to a server
//   gpuprof drain --server URL [--api-key K] [--dir D]       send the live push's spool files
//   gpuprof nsys-import FILE.sqlite [--db DB] [--run N] [--replace] [--pid PID]
//                                                            kernels of an nsys capture onto
//                                                            a run's steps
//   gpuprof export [DB] [RUN] [--format perfetto] [-o FILE|-] a run as a Perfetto / Chrome
//                                                            trace-event JSON file
//   gpuprof version
//
// Exit status: 0 on success (also --help), 1 when the data cannot be read or does not hold
// what was asked for (no such DB file, not a gpuprof DB, no such run or group), 2 on a usage
// error (unknown subcommand or option, an extra argument, a malformed value, no subcommand).
// The message on stderr says which and how to fix it.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "analysis/analysis.h"
#include "analysis/flops.h"
#include "analysis/format.h"
#include "analysis/pricing.h"
#include "analysis/rules/registry.h"
#include "export_cmd.h"
#include "merge_cmd.h"
#include "nsys_import_cmd.h"
#ifdef GPUPROF_HAVE_SERVER
#include "server/http_server.h"
#include "server/ingest_api.h"
#include "server/live_push.h"
#include "server/push.h"
#endif
#include "store/rows.h"
#include "store/sqlite_store.h"
#ifdef GPUPROF_WITH_POSTGRES
#include "store/pg_store.h"
#endif

#include <pthread.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

namespace gpuprof::cli {
namespace {

constexpr int kDataError = 1;
constexpr int kUsageError = 2;

int Fail(const std::string& message, int code = kDataError) {
  std::cerr << "gpuprof: " << analysis::ValidUtf8(message) << "\n";
  return code;
}

int UsageError(const std::string& message) { return Fail(message, kUsageError); }

// A run id as typed: digits only ("42"). One that does not fit in 64 bits is still a run id,
// of a run that cannot exist.
bool LooksLikeRunId(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(),
                                      [](unsigned char c) { return c >= '0' && c <= '9'; });
}

std::optional<int64_t> ParseRunId(const std::string& text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return v;
}

// JSON for stdout. Text read from a DB may hold invalid UTF-8 (an edited or damaged file):
// such bytes become U+FFFD instead of aborting the dump.
std::string DumpJson(const nlohmann::json& doc) {
  return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

// `gpuprof insights 42` means run 42 of ./gpuprof.db unless a file named "42" exists; so does
// `gpuprof insights latest` (the latest run) unless a file named "latest" exists. The same for
// `gpuprof push`.
void ApplyRunShorthand(std::string* db, std::string* run) {
  std::error_code ec;
  if (run->empty() && (LooksLikeRunId(*db) || *db == "latest") &&
      !std::filesystem::exists(*db, ec)) {
    *run = *db;
    *db = "gpuprof.db";
  }
}

// A gpuprof DB opened read-only with its run ids (ascending), or the exit status after the
// message saying why not (no such file, a directory, not a DB, no runs).
struct OpenedRuns {
  std::unique_ptr<store::RunStore> store;
  std::vector<int64_t> ids;
  int exit = 0;  // non-zero: failed
};

// `store` with its run ids, or the failure; `empty_hint` says what to do when it holds none.
OpenedRuns WithRuns(std::unique_ptr<store::RunStore> store, const std::string& where,
                    const char* empty_hint) {
  OpenedRuns out;
  auto runs = store->ListRuns();
  if (!runs) {
    out.exit = Fail(runs.error());
    return out;
  }
  if (runs->empty()) {
    out.exit = Fail(where + " holds no runs yet — " + empty_hint);
    return out;
  }
  for (const auto& r : *runs) out.ids.push_back(r.run_id);
  out.store = std::move(store);
  return out;
}

OpenedRuns OpenRuns(const std::string& db) {
  OpenedRuns out;
  std::error_code ec;
  if (!std::filesystem::exists(db, ec)) {
    out.exit = Fail("no such file: " + db + " — run a profiled script first, or pass the DB path");
    return out;
  }
  if (std::filesystem::is_directory(db, ec)) {
    out.exit = Fail(db + " is a directory; pass the gpuprof DB file (e.g. " +
                    (std::filesystem::path(db) / "gpuprof.db").string() + ")");
    return out;
  }
  auto store = store::SqliteStore::Open(db, store::SqliteStore::Mode::kReadOnly);
  if (!store) {
    out.exit = Fail(store.error());
    return out;
  }
  return WithRuns(std::move(store.value()), db, "run a script under gpuprof.profile() first");
}

// The SQLite file of a storage URL: sqlite://PATH (sqlite:///abs/path.db is /abs/path.db).
std::optional<std::string> SqlitePath(const std::string& url, std::string* why) {
  const std::string scheme = "sqlite://";
  if (url.rfind(scheme, 0) == 0 && url.size() > scheme.size()) return url.substr(scheme.size());
  if (url.rfind("postgres://", 0) == 0 || url.rfind("postgresql://", 0) == 0) {
    *why =
        "--storage-url: this gpuprof was built without PostgreSQL (libpq-dev); use sqlite://PATH";
  } else {
    *why = "--storage-url '" + url + "' is not sqlite://PATH or postgres://USER:PASSWORD@HOST/DB";
  }
  return std::nullopt;
}

// The runs of a --storage-url: sqlite://PATH (as a DB path) or postgres://... (a team server's
// database; never created here). *where names it for messages (the password redacted).
OpenedRuns OpenStorageRuns(const std::string& url, std::string* where) {
  std::string why;
  if (auto path = SqlitePath(url, &why)) {
    *where = *path;
    return OpenRuns(*path);
  }
  OpenedRuns out;
  *where = url;
#ifdef GPUPROF_WITH_POSTGRES
  if (store::IsPostgresUrl(url)) {
    *where = store::RedactPostgresUrl(url);
    store::PgStore::Options options;
    options.create = false;
    options.pool_size = 1;
    auto pg = store::PgStore::Open(url, options);
    if (!pg) {
      out.exit = Fail(pg.error());
      return out;
    }
    return WithRuns(std::move(pg.value()), *where, "push a run to the server first");
  }
#endif
  out.exit = UsageError(why);
  return out;
}

// The run RUN names among `ids` (the latest when empty or 'latest'), or the exit status after
// the message (not a run id: usage error; no such run: data error).
std::optional<int64_t> PickRun(const std::string& db, const std::string& run,
                               const std::vector<int64_t>& ids, int* exit) {
  if (run.empty() || run == "latest") return ids.back();
  if (!LooksLikeRunId(run)) {
    *exit = UsageError("RUN must be a run id (an integer) or 'latest', got '" + run + "'");
    return std::nullopt;
  }
  const std::optional<int64_t> parsed = ParseRunId(run);
  if (!parsed || std::find(ids.begin(), ids.end(), *parsed) == ids.end()) {
    *exit = Fail("no run " + run + " in " + db + " (run ids: " + analysis::NumberRanges(ids) + ")");
    return std::nullopt;
  }
  return parsed;
}

struct InsightsArgs {
  std::string db = "gpuprof.db";
  bool db_given = false;
  std::optional<std::string> storage_url;  // instead of DB: sqlite://PATH or postgres://...
  std::string run;                         // empty or "latest" = the latest run
  bool json = false;
  std::string gpu_rate;
  std::optional<std::string> group;  // --group NAME: analyze runs with runs.group_id == NAME
};

int RunInsights(InsightsArgs args) {
  if (!args.storage_url) ApplyRunShorthand(&args.db, &args.run);
  analysis::AnalysisOptions options;
  if (!args.gpu_rate.empty()) {
    options.gpu_rate_usd_per_hour = analysis::ParseRate(args.gpu_rate);
    if (!options.gpu_rate_usd_per_hour) {
      return UsageError("--gpu-rate '" + args.gpu_rate +
                        "' is not a non-negative number of USD per GPU-hour");
    }
  }
  OpenedRuns opened;
  if (args.storage_url) {
    // `insights --storage-url URL 3`: the one positional is the run.
    if (args.db_given && !args.run.empty()) {
      return UsageError("with --storage-url give only RUN, not a DB file (got '" + args.db +
                        "' and '" + args.run + "')");
    }
    if (args.db_given) args.run = args.db;
    opened = OpenStorageRuns(*args.storage_url, &args.db);
  } else {
    opened = OpenRuns(args.db);
  }
  if (opened.exit) return opened.exit;
  store::RunStore& db = *opened.store;
  if (args.group) {
    if (!args.run.empty()) {
      return UsageError("--group analyzes every run of the group; leave out RUN (got '" + args.run +
                        "')");
    }
    // NAME is a group id, or the run name of a group's runs (the newest such group).
    auto name = analysis::ResolveGroupName(db, *args.group);
    if (!name) return Fail(name.error());
    auto group = analysis::AnalyzeStoredGroup(db, name->group_id, options);
    if (!group) return Fail(group.error());
    if (args.json) {
      nlohmann::json doc = analysis::GroupReportJson(*group);
      // How NAME was read: null for a group id, else the run name and its groups.
      doc["group_of_run_name"] =
          name->groups_of_run_name
              ? nlohmann::json{{"run_name", *args.group}, {"groups", *name->groups_of_run_name}}
              : nlohmann::json(nullptr);
      std::cout << DumpJson(doc) << "\n";
    } else {
      if (name->groups_of_run_name) {
        std::cout << "group " << name->group_id << ": the newest group of runs named '"
                  << *args.group << "' ("
                  << analysis::Plural(*name->groups_of_run_name, "group", "groups") << ")\n";
      }
      std::cout << analysis::FormatGroupReport(*group, args.db);
    }
    return 0;
  }
  int exit = 0;
  const std::optional<int64_t> run_id = PickRun(args.db, args.run, opened.ids, &exit);
  if (!run_id) return exit;
  auto report = analysis::AnalyzeRun(db, *run_id, options);
  if (!report) return Fail(report.error());
  if (args.json) {
    std::cout << DumpJson(analysis::ReportJson(*report)) << "\n";
  } else {
    std::cout << analysis::FormatFullReport(*report);
  }
  return 0;
}

struct ServeArgs {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> api_keys;
  std::string api_key_file;
  std::string storage_url = "sqlite://gpuprof-server.db";
  double max_body_mb = 32;
  std::optional<std::string> viewer_password;
  std::string viewer_password_file;
  std::optional<std::string> secret_file;
};

struct PushArgs {
  std::string db = "gpuprof.db";
  std::string run;
  std::string server;
  std::string api_key;
  int batch_rows = 5000;
};

struct DrainArgs {
  std::string server;
  std::string api_key;
  std::string dir;
};

#ifdef GPUPROF_HAVE_SERVER
// A line of a secret file without its trailing carriage return and spaces.
void TrimLineEnd(std::string* line) {
  while (!line->empty() && (line->back() == '\r' || line->back() == ' ')) line->pop_back();
}

// The first line of a secret file, trimmed; nullopt when it cannot be read.
std::optional<std::string> FirstLine(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  std::getline(in, line);
  TrimLineEnd(&line);
  return line;
}

int RunServe(const ServeArgs& args) {
  server::ApiOptions api_options;
  for (const std::string& k : args.api_keys) {
    if (k.empty()) return UsageError("--api-key: a write key cannot be empty");
    api_options.api_keys.push_back(k);
  }
  if (!args.api_key_file.empty()) {
    std::ifstream in(args.api_key_file);
    if (!in) return UsageError("--api-key-file " + args.api_key_file + ": cannot be read");
    std::string line;
    size_t found = 0;
    while (std::getline(in, line)) {
      TrimLineEnd(&line);
      if (line.empty() || line[0] == '#') continue;
      api_options.api_keys.push_back(line);
      ++found;
    }
    if (found == 0) {
      return UsageError("--api-key-file " + args.api_key_file +
                        " holds no key (one per line; # starts a comment)");
    }
  }
  if (api_options.api_keys.empty()) {
    return UsageError(
        "serve needs at least one write key: --api-key KEY or --api-key-file F "
        "(clients send it in X-API-Key)");
  }
  if (!(args.max_body_mb > 0) || args.max_body_mb > 4096) {
    return UsageError("--max-body-mb must be in (0, 4096]");
  }
  api_options.max_body_bytes = static_cast<size_t>(args.max_body_mb * (1 << 20));
  if (args.port < 0 || args.port > 65535) return UsageError("--port must be 0-65535");
  std::string why;
  const auto path = SqlitePath(args.storage_url, &why);
#ifdef GPUPROF_WITH_POSTGRES
  const bool postgres = store::IsPostgresUrl(args.storage_url);
#else
  const bool postgres = false;
#endif
  if (!path && !postgres) return UsageError(why);
  if (args.viewer_password && !args.viewer_password_file.empty()) {
    return UsageError("give --viewer-password or --viewer-password-file, not both");
  }
  api_options.viewer_password = args.viewer_password;
  // Development: serve the web app from a source tree's web/ (edit and reload, no rebuild).
  if (const char* web = std::getenv("GPUPROF_WEB_DIR"); web && *web) api_options.web_dir = web;
  if (!args.viewer_password_file.empty()) {
    api_options.viewer_password = FirstLine(args.viewer_password_file);
    if (!api_options.viewer_password) {
      return UsageError("--viewer-password-file " + args.viewer_password_file + ": cannot be read");
    }
  }
  if (api_options.viewer_password && api_options.viewer_password->empty()) {
    return UsageError("the viewer password cannot be empty");
  }
  std::unique_ptr<server::ServerApi> api;
  std::string storage_label;
  if (path) {
    auto secret = server::LoadOrCreateSecret(args.secret_file, *path);
    if (!secret) return Fail(secret.error());
    api_options.secret = *secret;
    auto opened = server::ServerApi::Open(*path, api_options);
    if (!opened) return Fail(opened.error());
    api = std::move(opened.value());
    storage_label = "sqlite://" + *path;
  } else {
#ifdef GPUPROF_WITH_POSTGRES
    store::PgStore::Options pg_options;
    pg_options.pool_size = 8;
    auto pg = store::PgStore::Open(args.storage_url, pg_options);
    if (!pg) return Fail(pg.error());
    // The session secret: --secret-file, else one kept in the database (so that every server
    // on it signs alike), created once.
    Expected<std::string> secret = server::RandomSecret();
    if (args.secret_file) {
      secret = server::LoadOrCreateSecret(args.secret_file, "");
    } else if (secret) {
      secret = (*pg)->KeepMetaValue("session_secret", *secret);
    }
    if (!secret) return Fail(secret.error());
    api_options.secret = *secret;
    storage_label = (*pg)->location();
    api = server::ServerApi::Create(std::move(pg.value()), storage_label, api_options);
#endif
  }

  // SIGINT / SIGTERM stop the server: blocked here, awaited by one thread.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  server::ServerOptions options;
  options.host = args.host;
  options.port = static_cast<uint16_t>(args.port);
  auto http = server::HttpServer::Listen(options, api.get());
  if (!http) return Fail(http.error());
  std::cout << "gpuprof serve: listening on http://" << args.host << ":" << (*http)->port()
            << " (storage " << storage_label << ", " << api_options.api_keys.size() << " write key"
            << (api_options.api_keys.size() == 1 ? "" : "s") << ", viewing "
            << (api_options.viewer_password ? "on" : "off") << ")" << std::endl;
  server::HttpServer* raw = http->get();
  std::thread waiter([raw, stop_signals] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    raw->Stop();
  });
  raw->Serve();
  // Serve() returned: a signal stopped it (the waiter is done).
  waiter.join();
  std::cout << "gpuprof serve: stopped" << std::endl;
  return 0;
}

int RunPush(PushArgs args) {
  ApplyRunShorthand(&args.db, &args.run);
  if (args.api_key.empty()) {
    if (const char* env = std::getenv("GPUPROF_API_KEY")) args.api_key = env;
  }
  if (args.api_key.empty()) {
    return UsageError("push needs a write key: --api-key KEY or $GPUPROF_API_KEY");
  }
  if (args.batch_rows < 1) return UsageError("--batch-rows must be at least 1");
  int64_t run_id = 0;
  {
    OpenedRuns opened = OpenRuns(args.db);
    if (opened.exit) return opened.exit;
    int exit = 0;
    const std::optional<int64_t> picked = PickRun(args.db, args.run, opened.ids, &exit);
    if (!picked) return exit;
    run_id = *picked;
  }  // PushRun opens the file itself
  server::PushOptions options;
  options.server_url = args.server;
  options.api_key = args.api_key;
  options.batch_rows = static_cast<size_t>(args.batch_rows);
  auto pushed = server::PushRun(args.db, run_id, options);
  if (!pushed) return Fail(pushed.error());
  std::cout << "pushed run " << run_id << " of " << args.db << " to " << args.server
            << ": server run " << pushed->server_run_id << " (" << pushed->run_uuid << "), "
            << pushed->batches << " batches, " << pushed->rows << " rows stored";
  if (pushed->duplicate_batches > 0) {
    std::cout << " (" << pushed->duplicate_batches << " batches were already there)";
  }
  std::cout << "\n";
  return 0;
}

int RunDrain(DrainArgs args) {
  if (args.api_key.empty()) {
    if (const char* env = std::getenv("GPUPROF_API_KEY")) args.api_key = env;
  }
  if (args.api_key.empty()) {
    return UsageError("drain needs a write key: --api-key KEY or $GPUPROF_API_KEY");
  }
  if (args.dir.empty()) args.dir = server::DefaultSpoolDir();
  const server::DrainResult r = server::DrainSpool(args.dir, args.server, args.api_key);
  for (const std::string& line : r.lines) std::cout << line << "\n";
  return r.files_failed > 0 ? kDataError : 0;
}
#else
// Built without the server's dependencies (cpp/server/CMakeLists.txt, GPUPROF_SERVER).
int NoServer(const std::string& command) {
  return Fail(
      "gpuprof " + command +
          " is not available: this gpuprof was built without the "
          "team server (Boost, zlib, OpenSSL or dygraphs were missing at build time). "
          "Install libboost-dev zlib1g-dev libssl-dev libjs-dygraphs and reinstall gpuprof.",
      kUsageError);
}
int RunServe(const ServeArgs&) { return NoServer("serve"); }
int RunPush(PushArgs) { return NoServer("push"); }
int RunDrain(DrainArgs) { return NoServer("drain"); }
#endif  // GPUPROF_HAVE_SERVER

int Main(int argc, char** argv) {
  CLI::App app{"gpuprof: diagnoses why a training run is slow, in one sentence per problem."};
  app.name("gpuprof");
  app.require_subcommand(0, 1);

  InsightsArgs insights_args;
  CLI::App* insights = app.add_subcommand(
      "insights", "Print the full insights report of a stored run (latest run by default).");
  CLI::Option* insights_db = insights->add_option(
      "db", insights_args.db,
      "gpuprof SQLite file written by gpuprof.profile() (default: ./gpuprof.db)");
  insights->add_option("run", insights_args.run,
                       "Run id or 'latest' (the default). A lone integer or 'latest' is a run "
                       "of ./gpuprof.db unless a file of that name exists");
  insights->add_flag("--json", insights_args.json,
                     "Print a JSON document (run, steps, mfu, telemetry, insights, "
                     "not_evaluated; with --group: ranks, insights, not_evaluated) instead of "
                     "text");
  insights
      ->add_option("--group", insights_args.group,
                   "Analyze every rank of a multi-rank run: the runs whose group_id is NAME, "
                   "or, when none has, the newest group of the runs named NAME (per-rank "
                   "step and work times, clock offsets, rank skew, per-bucket collective "
                   "skew)")
      ->type_name("NAME");
  insights
      ->add_option("--storage-url", insights_args.storage_url,
                   "Read the runs of a team server's storage instead of a DB file: "
                   "sqlite://PATH or postgres://USER:PASSWORD@HOST/DB (then the one "
                   "positional argument is the RUN)")
      ->type_name("URL");
  insights->add_option("--gpu-rate", insights_args.gpu_rate,
                       "USD per GPU-hour for the cost line (overrides $GPUPROF_GPU_RATE and "
                       "the reference table)");

  bool markdown = false;
  bool reference = false;
  CLI::App* rules = app.add_subcommand("rules", "List the insight rules and their thresholds.");
  rules->add_flag("--markdown", markdown, "Print Markdown tables (the README rule table)");
  rules->add_flag("--reference", reference,
                  "Print the reference tables instead: dense peak TFLOPs per GPU model and "
                  "dtype (MFU) and USD per GPU-hour (cost), as Markdown");

  ServeArgs serve_args;
  CLI::App* serve =
      app.add_subcommand("serve", "Run the team server: clients push runs to it (docs/server.md).");
  serve->add_option("--host", serve_args.host, "Address to listen on (default 127.0.0.1)");
  serve->add_option("--port", serve_args.port, "Port (default 8000; 0 picks a free one)");
  serve
      ->add_option("--api-key", serve_args.api_keys,
                   "A write key clients send in X-API-Key (repeat for several: rotation)")
      ->type_name("KEY");
  serve
      ->add_option("--api-key-file", serve_args.api_key_file,
                   "File of write keys, one per line (# comments)")
      ->type_name("FILE");
  serve
      ->add_option("--storage-url", serve_args.storage_url,
                   "Where runs are stored: sqlite://PATH (default sqlite://gpuprof-server.db)")
      ->type_name("URL");
  serve->add_option("--max-body-mb", serve_args.max_body_mb,
                    "Largest request body accepted, after gzip inflation (default 32)");
  serve
      ->add_option("--viewer-password", serve_args.viewer_password,
                   "Password viewers log in with (the read API; off without one)")
      ->type_name("P");
  serve
      ->add_option("--viewer-password-file", serve_args.viewer_password_file,
                   "File whose first line is the viewer password")
      ->type_name("FILE");
  serve
      ->add_option("--secret-file", serve_args.secret_file,
                   "Key that signs viewer sessions (>= 32 bytes; default: generated once into "
                   "STORE.secret, mode 0600)")
      ->type_name("FILE");

  PushArgs push_args;
  CLI::App* push = app.add_subcommand("push", "Send a stored run to a gpuprof server.");
  push->add_option("db", push_args.db, "gpuprof SQLite file (default: ./gpuprof.db)");
  push->add_option("run", push_args.run, "Run id or 'latest' (the default)");
  push->add_option("--server", push_args.server, "Server URL, http://HOST:PORT")->required();
  push->add_option("--api-key", push_args.api_key, "Write key (default: $GPUPROF_API_KEY)")
      ->type_name("KEY");
  push->add_option("--batch-rows", push_args.batch_rows, "Rows per request (default 5000)");

  DrainArgs drain_args;
  CLI::App* drain = app.add_subcommand(
      "drain", "Send the runs a live push could not deliver (its spool files) to a server.");
  drain->add_option("--server", drain_args.server, "Server URL, http://HOST:PORT")->required();
  drain->add_option("--api-key", drain_args.api_key, "Write key (default: $GPUPROF_API_KEY)")
      ->type_name("KEY");
  drain->add_option("--dir", drain_args.dir,
                    "Spool directory (default: $GPUPROF_BUFFER_DIR, else ~/.gpuprof/buffer)");

  const Subcommand nsys_import = AddNsysImportCommand(app);

  // `export` picks its DB and RUN as `insights` does.
  const Subcommand export_cmd = AddExportCommand(
      app,
      [](std::string db, std::string run) {
        ApplyRunShorthand(&db, &run);
        PickedRun picked;
        OpenedRuns opened = OpenRuns(db);
        if (opened.exit) {
          picked.exit = opened.exit;
          return picked;
        }
        const std::optional<int64_t> id = PickRun(db, run, opened.ids, &picked.exit);
        if (!id) return picked;
        picked.store = std::move(opened.store);
        picked.run_id = *id;
        return picked;
      },
      [](std::string db) {
        PickedRun picked;
        OpenedRuns opened = OpenRuns(db);
        picked.exit = opened.exit;
        picked.store = std::move(opened.store);
        return picked;
      });

  const Subcommand merge = AddMergeCommand(app);

  CLI::App* version = app.add_subcommand("version", "Print the gpuprof version.");

  app.footer("Exit status: 0 ok, 1 data error (no such DB, run or group), 2 usage error.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help (and CLI11's other "success" exits) print and exit 0; every malformed command
    // line is a usage error, whatever CLI11's internal code for it.
    const int code = app.exit(e);
    return code == 0 ? 0 : kUsageError;
  }

  if (insights->parsed()) {
    insights_args.db_given = insights_db->count() > 0;
    return RunInsights(insights_args);
  }
  if (serve->parsed()) return RunServe(serve_args);
  if (push->parsed()) return RunPush(push_args);
  if (drain->parsed()) return RunDrain(drain_args);
  if (nsys_import.command->parsed()) return nsys_import.run();
  if (export_cmd.command->parsed()) return export_cmd.run();
  if (merge.command->parsed()) return merge.run();
  if (rules->parsed()) {
    if (reference) {
      std::cout << "Peak TFLOPs (dense, per GPU)\n\n"
                << analysis::PeakTflopsMarkdown() << "\nReference GPU rates\n\n"
                << analysis::GpuRatesMarkdown();
    } else {
      std::cout << (markdown ? analysis::RulesMarkdown() : analysis::RulesText());
    }
    return 0;
  }
  if (version->parsed()) {
    std::cout << "gpuprof " << GPUPROF_VERSION << " (store schema " << store::kSchemaVersion
              << ")\n";
    // What this build has of the parts that depend on libraries found at build time (README:
    // Install).
#ifdef GPUPROF_HAVE_SERVER
    std::cout << "team server, push, dashboard, webhook: built\n";
#else
    std::cout << "team server, push, dashboard, webhook: not built (Boost, zlib, OpenSSL or "
                 "libjs-dygraphs were missing at build time)\n";
#endif
#ifdef GPUPROF_WITH_POSTGRES
    std::cout << "PostgreSQL storage: built\n";
#else
    std::cout << "PostgreSQL storage: not built (libpq was missing at build time)\n";
#endif
    return 0;
  }
  std::cerr << app.help();
  return kUsageError;
}

}  // namespace
}  // namespace gpuprof::cli

// No C++ exception leaves the CLI: whatever escapes (a bug, a damaged DB that trips a library)
// is one line on stderr and exit status 1, never an abort.
// Secrets given on the command line (--api-key K, --viewer-password P, and their --opt=V forms;
// the password of a --storage-url) are parsed from copies, and the originals overwritten: ps and
// /proc/PID/cmdline then show "x" for them, not the secret.
int main(int argc, char** argv) {
  std::vector<std::string> copies(argv, argv + argc);
  std::vector<char*> args;
  for (std::string& a : copies) args.push_back(a.data());
  args.push_back(nullptr);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    for (const char* opt : {"--api-key", "--viewer-password"}) {
      const std::string o = opt;
      char* secret = nullptr;
      if (a == o && i + 1 < argc) secret = argv[i + 1];
      if (a.rfind(o + "=", 0) == 0) secret = argv[i] + o.size() + 1;
      if (secret) {
        for (char* c = secret; *c; ++c) *c = 'x';
      }
    }
    // --storage-url postgres://user:PASSWORD@host/db (or ?password=...): the password only.
    char* url = nullptr;
    if (a == "--storage-url" && i + 1 < argc) url = argv[i + 1];
    if (a.rfind("--storage-url=", 0) == 0) url = argv[i] + std::strlen("--storage-url=");
    if (url) {
      for (const auto& [begin, end] : gpuprof::store::UrlPasswordSpans(url)) {
        for (size_t k = begin; k < end; ++k) url[k] = 'x';
      }
    }
  }
  argv = args.data();
  try {
    return gpuprof::cli::Main(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "gpuprof: internal error: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "gpuprof: internal error (unknown exception)\n";
  }
  return 1;
}
