-- gpuprof store schema, version 1. Documented in docs/schema.md.
-- Portable subset of SQL shared by SQLite (client, server) and Postgres (server, later):
-- BIGINT/DOUBLE PRECISION/TEXT only, explicit keys, no SQLite-only types.
-- Timestamps: *_ns columns inside a run are monotonic nanoseconds relative to the run's
-- start (runs.start_mono_ns); runs.start_unix_ns anchors them to wall time.
-- NULL always means "not measured"; the reason is in telemetry_status or diagnostics.

CREATE TABLE IF NOT EXISTS meta (
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS runs (
  run_id           INTEGER PRIMARY KEY,
  run_name         TEXT NOT NULL,
  group_id         TEXT,
  rank             BIGINT,
  world_size       BIGINT,
  hostname         TEXT,
  pid              BIGINT,
  start_unix_ns    BIGINT NOT NULL,
  start_mono_ns    BIGINT NOT NULL,
  end_ns           BIGINT,            -- run-relative; NULL while running or if killed
  status           TEXT NOT NULL,     -- running | ok | failed
  error            TEXT,              -- exception type and message when failed
  device_kind      TEXT,              -- cuda | cpu | unknown
  gpu_backend      TEXT,              -- nvml | mock | none
  gpu_model        TEXT,
  gpu_count        BIGINT,
  dtype            TEXT,              -- declared compute dtype for MFU (bf16, fp16, tf32, fp32)
  flops_per_step   DOUBLE PRECISION,  -- declared or counted model FLOPs per optimizer step
  flops_method     TEXT,              -- declared | arch | counted
  sample_hz        DOUBLE PRECISION,
  gpuprof_version  TEXT NOT NULL,
  python_version   TEXT,
  torch_version    TEXT,
  config_json      TEXT               -- every profile() option, as given
);
CREATE INDEX IF NOT EXISTS runs_by_name ON runs(run_name, run_id);
CREATE INDEX IF NOT EXISTS runs_by_group ON runs(group_id, rank);

-- One row per optimizer step (auto) or prof.step() (manual).
CREATE TABLE IF NOT EXISTS steps (
  run_id         BIGINT NOT NULL,
  step           BIGINT NOT NULL,
  start_ns       BIGINT NOT NULL,     -- previous step's end (or first activity for step 0)
  end_ns         BIGINT NOT NULL,
  wait_ns        BIGINT,              -- dataloader wait; NULL if not measured
  wait_source    TEXT,                -- gap (inter-step) | explicit (wrap_dataloader)
  forward_calls  BIGINT NOT NULL DEFAULT 0,
  backward_calls BIGINT NOT NULL DEFAULT 0,
  optimizer_calls BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (run_id, step)
);

-- Per step and phase name: summed CPU wall time and (when measured) GPU time.
CREATE TABLE IF NOT EXISTS phases (
  run_id   BIGINT NOT NULL,
  step     BIGINT NOT NULL,
  name     TEXT NOT NULL,             -- forward | backward | optimizer | any manual name
  wall_ns  BIGINT NOT NULL,           -- CPU-side wall time (launch time on CUDA)
  gpu_ns   BIGINT,                    -- CUDA-event time; NULL when not measured
  calls    BIGINT NOT NULL,
  PRIMARY KEY (run_id, step, name)
);

CREATE TABLE IF NOT EXISTS gpus (
  run_id        BIGINT NOT NULL,
  gpu_index     BIGINT NOT NULL,
  name          TEXT,
  uuid          TEXT,
  memory_total_bytes BIGINT,
  sm_clock_max_mhz   BIGINT,
  PRIMARY KEY (run_id, gpu_index)
);

-- GPU telemetry at sample_hz. Any column may be NULL (not supported / failed read).
CREATE TABLE IF NOT EXISTS gpu_samples (
  run_id         BIGINT NOT NULL,
  ts_ns          BIGINT NOT NULL,
  gpu_index      BIGINT NOT NULL,
  util_pct       DOUBLE PRECISION,
  mem_util_pct   DOUBLE PRECISION,
  mem_used_bytes BIGINT,
  mem_total_bytes BIGINT,
  proc_mem_bytes BIGINT,              -- this process tree's device memory
  power_mw       BIGINT,
  temp_c         DOUBLE PRECISION,
  sm_clock_mhz   BIGINT,
  clock_reasons  BIGINT,              -- NVML clocks-event reason bitmask
  pcie_rx_bps    DOUBLE PRECISION,
  pcie_tx_bps    DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS gpu_samples_by_run ON gpu_samples(run_id, gpu_index, ts_ns);

CREATE TABLE IF NOT EXISTS host_samples (
  run_id          BIGINT NOT NULL,
  ts_ns           BIGINT NOT NULL,
  cpu_pct         DOUBLE PRECISION,   -- all cores, 0..100
  cpu_per_core    TEXT,               -- JSON array of per-core percentages
  ncores          BIGINT,
  mem_used_bytes  BIGINT,
  mem_total_bytes BIGINT,
  page_cache_bytes BIGINT,
  swap_in_bps     DOUBLE PRECISION,
  disk_read_bps   DOUBLE PRECISION,
  disk_read_iops  DOUBLE PRECISION,
  proc_cpu_pct    DOUBLE PRECISION,   -- training process tree, percent of one core
  proc_rss_bytes  BIGINT
);
CREATE INDEX IF NOT EXISTS host_samples_by_run ON host_samples(run_id, ts_ns);

-- The training process and its children (dataloader workers), per host tick.
CREATE TABLE IF NOT EXISTS worker_samples (
  run_id    BIGINT NOT NULL,
  ts_ns     BIGINT NOT NULL,
  pid       BIGINT NOT NULL,
  role      TEXT NOT NULL,            -- main | child
  cpu_pct   DOUBLE PRECISION,         -- percent of one core
  rss_bytes BIGINT
);
CREATE INDEX IF NOT EXISTS worker_samples_by_run ON worker_samples(run_id, ts_ns);

-- Kernel aggregates per step window (filled by later trace features / nsys import).
CREATE TABLE IF NOT EXISTS kernels (
  run_id   BIGINT NOT NULL,
  window_start_ns BIGINT NOT NULL,
  window_end_ns   BIGINT NOT NULL,
  name     TEXT NOT NULL,
  calls    BIGINT NOT NULL,
  gpu_ns   BIGINT NOT NULL,
  source   TEXT NOT NULL              -- torch_profiler | cupti | nsys
);
CREATE INDEX IF NOT EXISTS kernels_by_run ON kernels(run_id, window_start_ns);

-- Per collective bucket timing (filled by the DDP comm hook, later).
CREATE TABLE IF NOT EXISTS comm_buckets (
  run_id   BIGINT NOT NULL,
  step     BIGINT NOT NULL,
  bucket   BIGINT NOT NULL,
  start_ns BIGINT NOT NULL,
  end_ns   BIGINT NOT NULL,
  bytes    BIGINT
);
CREATE INDEX IF NOT EXISTS comm_buckets_by_run ON comm_buckets(run_id, step);

-- Which telemetry sources ran, and why not when they did not.
CREATE TABLE IF NOT EXISTS telemetry_status (
  run_id    BIGINT NOT NULL,
  source    TEXT NOT NULL,            -- gpu | host | cuda_events | ...
  available BIGINT NOT NULL,          -- 0/1
  backend   TEXT,
  reason    TEXT,
  PRIMARY KEY (run_id, source)
);

CREATE TABLE IF NOT EXISTS insights (
  run_id    BIGINT NOT NULL,
  ordinal   BIGINT NOT NULL,
  rule_id   TEXT NOT NULL,
  family    TEXT NOT NULL,
  severity  TEXT NOT NULL,            -- high | med | low | info
  message   TEXT NOT NULL,
  fix       TEXT,
  evidence_json TEXT,
  PRIMARY KEY (run_id, ordinal)
);

-- Problems inside gpuprof (never raised into the training loop) and notable events
-- (dropped events, telemetry failures mid-run).
CREATE TABLE IF NOT EXISTS diagnostics (
  run_id  BIGINT NOT NULL,
  ts_ns   BIGINT,
  level   TEXT NOT NULL,              -- info | warning | error
  source  TEXT NOT NULL,
  message TEXT NOT NULL
);
