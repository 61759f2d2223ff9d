# gpuprof task runner. `make help` lists the targets.
.DEFAULT_GOAL := help
PY := .venv/bin/python
PY312 := .venv312/bin/python
PY313 := .venv313/bin/python
# The 3.11 build scripts/setup.sh makes (pyproject.toml: build-dir = build/{wheel_tag}).
BUILD ?= $(firstword $(wildcard build/cp311-*) build/cp311-cp311-linux_x86_64)

.PHONY: help setup demo test test-cpp test-fuzz test-py test-wheel lint fuzz bench bench-lines bench-dashboard bench-distributed screenshots rules-table stubs format clean sanitize test-quick

help: ## Show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-12s %s\n", $$1, $$2}'

setup: ## Install everything (apt packages, .venv, torch CPU, gpuprof from source)
	@bash scripts/setup.sh

demo: setup ## Set up, then run the CPU demo training under gpuprof and print insights
	cd examples && ../$(PY) train_cpu.py

test: setup ## Set up, then run all tests (lint, ctest, a 30 s fuzz run, ASan+UBSan, pytest, the wheel)
	@$(MAKE) --no-print-directory lint test-cpp test-fuzz sanitize test-py test-wheel

test-cpp: ## C++ tests (GoogleTest via ctest), assumes setup
	ctest --test-dir $(BUILD) --output-on-failure -j2

test-fuzz: ## Ingest fuzzing for 30 s (builds build/fuzz once, clang), assumes setup
	@bash scripts/fuzz.sh 30

test-py: ## Python tests (pytest through the public API), assumes setup
	$(PY) -m pytest tests -q
	@if [ -x $(PY312) ]; then echo "linescope on Python 3.12 (sys.monitoring):"; \
	  $(PY312) -m pytest tests/linescope -q -p no:cacheprovider; fi
	@if [ -x $(PY313) ]; then echo "linescope on Python 3.13 (sys.monitoring):"; \
	  $(PY313) -m pytest tests/linescope -q -p no:cacheprovider; fi

lint: ## Static checks: clang-format (cpp/), ruff (python/, scripts/), mypy --strict (python/)
	@bash scripts/lint.sh

test-wheel: ## The wheel `pip wheel .` builds, installed into a fresh venv: version, imports, the CPU demo
	@bash scripts/wheel_check.sh

fuzz: ## Fuzz the ingest parser for 300 s (libFuzzer, ASan+UBSan; scripts/fuzz.sh SECS)
	@bash scripts/fuzz.sh 300

bench: setup ## Benchmarks (not pass/fail): overhead vs torch.profiler, hook and sampler costs
	$(PY) bench/overhead.py

bench-distributed: setup ## DDP comm hook cost per step (2-rank gloo, interleaved rounds) and clock alignment time
	$(PY) bench/distributed.py $(ARGS)

bench-dashboard: setup ## The dashboard's first render and window changes on the 24 h x 8 GPU run (Chromium)
	test -f build/long_run/long_run.db || bench/long_run/run.sh 24 8
	$(PY) bench/dashboard_render.py

screenshots: setup ## Regenerate the dashboard screenshots in docs/images from real runs
	$(PY) scripts/screenshots.py

bench-lines: ## linescope `trace` vs a minimal hook, line_profiler, cProfile (.venv, .venv312, .venv313); ARGS=...
	@for py in $(PY) $(PY312) $(PY313); do if [ -x $$py ]; then \
	  $$py -c "import line_profiler, pandas" 2>/dev/null || $$py -m pip install -q line_profiler pandas; fi; done
	$(PY) bench/linescope/run.py $(ARGS)

rules-table: setup ## Regenerate the rule tables in README.md and docs/rules.md from the registry
	for doc in README.md docs/rules.md; do \
	  cmake -DGPUPROF=.venv/bin/gpuprof -DDOC=$$doc -DUPDATE=ON -P cpp/cli/check_rules_doc.cmake; done

stubs: setup ## Regenerate python/gpuprof/_native.pyi with nanobind's stubgen (tests/test_packaging.py checks it)
	$(PY) -m nanobind.stubgen -q -m gpuprof._native -p scripts/stubgen-patterns.txt \
	  -o python/gpuprof/_native.pyi

format: ## clang-format the C++ tree
	find cpp -name '*.h' -o -name '*.cc' -o -name '*.c' | xargs clang-format -i

clean: ## Remove build outputs (keeps .venv)
	rm -rf build

sanitize: ## ASan+UBSan (clang, build/fuzz): all C++ tests and the native-heavy pytest files
	@bash scripts/sanitize.sh

test-quick: ## Unit tests only, under a minute (ctest and pytest subsets; GPUPROF_BUILD_DIR=...)
	@bash scripts/test_quick.sh
