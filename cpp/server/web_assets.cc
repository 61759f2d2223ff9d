#include "server/web_assets.h"

#include <fstream>
#include <sstream>

namespace gpuprof::server {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "app/x.js" -> "dashboard/x.js" and "lib/x.js" -> "lib/x.js" under a source tree's web/;
// vendored files are never read from there (they come from the Debian package at build time).
std::optional<std::string> SourcePath(const std::string& rel) {
  if (rel.rfind("app/", 0) == 0) return "dashboard/" + rel.substr(4);
  if (rel.rfind("lib/", 0) == 0) return rel;
  return std::nullopt;
}

}  // namespace

std::string ContentTypeFor(const std::string& path) {
  if (EndsWith(path, ".html")) return "text/html; charset=utf-8";
  if (EndsWith(path, ".js")) return "text/javascript; charset=utf-8";
  if (EndsWith(path, ".css")) return "text/css; charset=utf-8";
  if (EndsWith(path, ".svg")) return "image/svg+xml";
  if (EndsWith(path, ".json")) return "application/json";
  return "text/plain; charset=utf-8";
}

std::optional<WebAsset> FindWebAsset(const std::string& path,
                                     const std::optional<std::string>& web_dir) {
  if (path.empty() || path[0] != '/') return std::nullopt;
  std::string rel = path.substr(1);
  if (rel.empty() || rel == "index.html") rel = "app/index.html";
  if (rel.find("..") != std::string::npos || rel.find('\\') != std::string::npos ||
      rel.find('\0') != std::string::npos || rel.find("//") != std::string::npos) {
    return std::nullopt;
  }
  if (web_dir) {
    if (auto source = SourcePath(rel)) {
      std::ifstream in(*web_dir + "/" + *source, std::ios::binary);
      if (!in) return std::nullopt;
      std::ostringstream body;
      body << in.rdbuf();
      return WebAsset{body.str(), ContentTypeFor(rel)};
    }
  }
  for (const WebFile& f : EmbeddedWebFiles()) {
    if (rel == f.path) return WebAsset{std::string(f.body), ContentTypeFor(rel)};
  }
  return std::nullopt;
}

}  // namespace gpuprof::server
