// `gpuprof merge OUT IN [IN ...]`: copies every run of the IN files into OUT (created when
// missing), each run with all its rows and insights in one transaction. A job whose nodes each
// wrote a file of their own (node-local disks) becomes one file that `gpuprof insights OUT
// --group NAME` and each rank's own report (peer_wait) read as if the ranks had shared it.
// Merging a run again is a no-op: a run is known in OUT by its host, pid and start time.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

#include "subcommand.h"

namespace gpuprof::cli {

// Adds the `merge` subcommand to `app`.
Subcommand AddMergeCommand(CLI::App& app);

}  // namespace gpuprof::cli
