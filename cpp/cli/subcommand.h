// A subcommand of the `gpuprof` executable that lives in a file of its own (export, merge,
// nsys-import): Add<Name>Command(app) registers it on the CLI11 app and returns this.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace gpuprof::cli {

struct Subcommand {
  CLI::App* command = nullptr;  // parsed() after app.parse() when it was given
  std::function<int()> run;     // runs it: the exit status (0, 1 data error, 2 usage error)
};

}  // namespace gpuprof::cli
