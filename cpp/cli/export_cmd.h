// `gpuprof export [DB] [RUN | --group NAME] --format perfetto [-o FILE]`: a stored run (or every
// rank of a group, one process each, on the common clock) as a Chrome trace-event
// JSON file that ui.perfetto.dev and chrome://tracing open (traces/perfetto_export.h has the
// track layout). Without -o it writes <run name>-<run id>.trace.json in the current directory;
// `-o -` writes to stdout.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "store/run_store.h"
#include "subcommand.h"

namespace gpuprof::cli {

// A run picked from `[DB] [RUN]` the way `gpuprof insights` picks it (main.cc): the store
// opened read-only and the run's id, or the exit status after the message saying why not.
struct PickedRun {
  std::unique_ptr<store::RunStore> store;
  int64_t run_id = 0;
  int exit = 0;  // non-zero: failed, message printed
};
using RunPicker = std::function<PickedRun(std::string db, std::string run)>;
// The store of `[DB]` opened read-only as `gpuprof insights` opens it (run_id unused).
using StoreOpener = std::function<PickedRun(std::string db)>;

// Adds the `export` subcommand to `app`; `pick` resolves its DB and RUN arguments, `open` its DB
// for --group.
Subcommand AddExportCommand(CLI::App& app, RunPicker pick, StoreOpener open);

}  // namespace gpuprof::cli
