// Helpers shared by the telemetry tests: a self-removing temporary directory and file writing.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace gpuprof::telemetry::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "gpuprof_telemetry_XXXXXX");
    char* made = mkdtemp(tmpl.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

  // Writes `text` to path()/relative, creating parent directories. Returns the full path.
  std::string Write(const std::string& relative, const std::string& text) const {
    std::filesystem::path p = std::filesystem::path(path_) / relative;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::trunc);
    out << text;
    EXPECT_TRUE(out.good()) << "cannot write " << p;
    return p.string();
  }

 private:
  std::string path_;
};

}  // namespace gpuprof::telemetry::testing
