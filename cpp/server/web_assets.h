// The dashboard's web app as the server serves it: the files of web/dashboard (under /app/),
// web/lib (under /lib/) and the vendored dygraphs (under /vendor/dygraphs/), embedded into the
// binary at build time (cpp/server/CMakeLists.txt), or read from a source tree's web/ directory
// on every request when one is given (development: edit, reload, no rebuild).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuprof::server {

struct WebFile {
  const char* path;  // URL path without the leading '/': "app/app.js", "lib/format.js"
  std::string_view body;
};

// Every embedded file (generated web_assets.cc).
const std::vector<WebFile>& EmbeddedWebFiles();

struct WebAsset {
  std::string body;
  std::string content_type;
};

// The asset for URL path `path` (starting with '/'; "/" is the app's index.html): from
// `web_dir` (a source tree's web/ directory) when given, else embedded; nullopt when there is
// none. Paths with "..", a backslash or a NUL never leave the asset set.
std::optional<WebAsset> FindWebAsset(const std::string& path,
                                     const std::optional<std::string>& web_dir);

// The MIME type served for a file name (by extension; text types are UTF-8).
std::string ContentTypeFor(const std::string& path);

}  // namespace gpuprof::server
