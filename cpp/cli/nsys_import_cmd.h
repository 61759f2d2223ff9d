// `gpuprof nsys-import FILE.sqlite [--db DB] [--run N] [--replace] [--pid PID]`: the kernels of
// an Nsight Systems capture (`nsys export --type sqlite`) attached to the steps of a stored run,
// as kernels rows with source "nsys" (traces/nsys_import.h says how kernels are matched).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

#include "subcommand.h"

namespace gpuprof::cli {

// Adds the `nsys-import` subcommand to `app`; its arguments live in the returned `run`.
Subcommand AddNsysImportCommand(CLI::App& app);

}  // namespace gpuprof::cli
