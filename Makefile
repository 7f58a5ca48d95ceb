# torch_tpu — build, run and test.
#   make run        main job (creates .venv, builds everything, trains minGPT on tpu: strict vs DeferAndFuse)
#   make demo       device tour (examples/demo.py)
#   make test       all tests CI runs: C tests (release + ASan/UBSan) and pytest
#   make build      venv + runtime + extension (incremental)
#   make bench      benchmarks (results printed and appended to BENCHMARKS.md), then the workload matrix
#                   and Llama size sweep (BENCH_PRESET=--quick by default, --full for realistic sizes)
#   make test-full  longer suites, OpInfo conformance of the whole database (tests/conformance/REPORT.md),
#                   the Hugging Face architecture sweep (tests/hf/SWEEP.md), TorchTitan and Ray Train
#   make venv-full  the extra clients test-full tries (requirements-full*.txt: TorchTitan, Ray Train)
#   make wheel      dist/torch_tpu-*.whl built from a clean copy of the sources (pip wheel .)
#   make wheel-build the same with python -m build: sdist, then the wheel from it (build/dist-build/)
#   make test-wheel both wheels, each installed into a fresh venv (with torch==2.13.0) + a smoke test
#   make fuzz       differential fuzzing, tpu vs CPU in strict, defer and compiled modes (N=10000, SEED=0)
#   make fuzz-c     coverage-guided fuzzing of the C runtime (libFuzzer, clang; FUZZ_SECONDS per harness)
#   make test-c-tsan  stream / pool / allocator / defer C tests under ThreadSanitizer
#   make test-py-tsan the Python concurrency tests (threads on one and two chips, strict and defer) against
#                   the runtime built with ThreadSanitizer: any race report with a frame in libtpurt fails it
#   make soak       1,000 Llama training steps per mode: device memory and host RSS flat (RELIABILITY.md)
#   make docs       the user guide: runs every notebook in docs/ and exports it to HTML in docs/_build/
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
JOBS   ?= 2
BENCH_PRESET ?= --quick

RUNTIME_SRC := $(wildcard runtime/include/*.h runtime/src/*.c runtime/src/*.h runtime/src/*/*.c runtime/src/*/*.h runtime/CMakeLists.txt)
GLUE_SRC    := $(wildcard torch_tpu/csrc/*.cpp torch_tpu/csrc/*.h) setup.py

.PHONY: all venv venv-full build run demo test test-c test-c-asan test-c-tsan test-py-tsan test-py test-full bench docs clean wheel wheel-build test-wheel fuzz fuzz-c soak

all: build

$(VENV)/.deps: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

venv: $(VENV)/.deps

# The clients of tests/test_dist_clients.py, not needed by `make test`. torch stays
# the pinned build (requirements-full.txt repeats its pin); torchtitan is installed
# without its dependencies (listed in requirements-full.txt instead), then pip check.
$(VENV)/.deps-full: $(VENV)/.deps requirements-full.txt requirements-full-nodeps.txt
	$(PIP) install --quiet --disable-pip-version-check -r requirements-full.txt
	$(PIP) install --quiet --disable-pip-version-check --no-deps -r requirements-full-nodeps.txt
	$(PIP) check
	touch $@

venv-full: $(VENV)/.deps-full

# The editable install registers the package and its entry points
# (torch.backends autoload, the torch-tpu CLI) in the venv; the extension is
# built by the next rule only (not a second time by pip).
$(VENV)/.installed: $(VENV)/.deps pyproject.toml
	TORCH_TPU_REGISTER_ONLY=1 $(PIP) install --quiet --disable-pip-version-check --no-build-isolation --no-deps -e .
	touch $@

torch_tpu/.built: $(VENV)/.installed $(RUNTIME_SRC) $(GLUE_SRC)
	TORCH_DEVICE_BACKEND_AUTOLOAD=0 MAX_JOBS=$(JOBS) $(PY) setup.py --quiet build_ext --inplace
	touch $@

build: torch_tpu/.built

run: build
	$(PY) examples/mingpt/train.py --steps 120 --compare

demo: build
	$(PY) examples/demo.py

build/runtime/.configured: runtime/CMakeLists.txt $(VENV)/.deps
	cmake -S runtime -B build/runtime -G Ninja -DCMAKE_BUILD_TYPE=Release -DTPURT_NATIVE=OFF >/dev/null
	touch $@

build/runtime-asan/.configured: runtime/CMakeLists.txt $(VENV)/.deps
	cmake -S runtime -B build/runtime-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTPURT_SANITIZE=address,undefined -DTPURT_NATIVE=ON >/dev/null
	touch $@

test-c: build/runtime/.configured
	cmake --build build/runtime
	ctest --test-dir build/runtime --output-on-failure -j$(JOBS)

# LeakSanitizer runs with ASan (detect_leaks, on by default on x86-64 Linux, made explicit here).
test-c-asan: build/runtime-asan/.configured
	cmake --build build/runtime-asan
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 ctest --test-dir build/runtime-asan --output-on-failure -j$(JOBS)

# ThreadSanitizer: the tests of the modules that share state between threads.
TSAN_TESTS := stream event pool memory host_alloc defer multidev
empty :=
space := $(empty) $(empty)
build/runtime-tsan/.configured: runtime/CMakeLists.txt $(VENV)/.deps
	cmake -S runtime -B build/runtime-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTPURT_SANITIZE=thread -DTPURT_NATIVE=ON >/dev/null
	touch $@

test-c-tsan: build/runtime-tsan/.configured
	cmake --build build/runtime-tsan --target $(addprefix test_,$(TSAN_TESTS))
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/runtime/tests/tsan.supp" \
	  ctest --test-dir build/runtime-tsan --output-on-failure -j$(JOBS) -R '^($(subst $(space),|,$(TSAN_TESTS)))$$'

# The Python concurrency tests with the runtime built with ThreadSanitizer (libtsan preloaded, the TSan
# libtpurt.so found first on LD_LIBRARY_PATH). torch is not instrumented, so reports without a frame in
# libtpurt (torch's own threads) are not ours: the target fails on the reports that name libtpurt. The
# DataLoader and fork tests stay out: a process forked from a TSan process with threads cannot run.
TSAN_PY_LOG := $(CURDIR)/build/tsan-py/report
test-py-tsan: build build/runtime-tsan/.configured
	cmake --build build/runtime-tsan --target tpurt
	rm -rf build/tsan-py && mkdir -p build/tsan-py
	TSAN_OPTIONS="report_signal_unsafe=0 exitcode=0 log_path=$(TSAN_PY_LOG) suppressions=$(CURDIR)/runtime/tests/tsan-py.supp" \
	  LD_PRELOAD=$$($(CC) -print-file-name=libtsan.so) LD_LIBRARY_PATH=$(CURDIR)/build/runtime-tsan \
	  TORCH_TPU_CACHE_DIR=$(CURDIR)/build/tsan-py/kcache $(PY) -m pytest -q -p no:cacheprovider tests/test_concurrency.py -k "threads"
	@if grep -l "libtpurt.so" build/tsan-py/report.* >/dev/null 2>&1; then \
	  grep -h -B2 -A30 "libtpurt.so" build/tsan-py/report.* | head -150; echo "ThreadSanitizer: races in libtpurt (build/tsan-py/)"; exit 1; \
	else echo "ThreadSanitizer: no report names libtpurt"; fi

# Coverage-guided fuzzing (libFuzzer): the runtime and runtime/tests/fuzz_*.c built with clang,
# ASan and UBSan; each harness runs FUZZ_SECONDS on its corpus (runtime/tests/fuzz_corpus/NAME,
# new inputs kept in build/fuzz-corpus/NAME); a crash leaves its input in build/fuzz-crashes/.
CLANG ?= $(shell command -v clang || command -v clang-14)
FUZZ_SECONDS ?= 60
FUZZ_HARNESSES := $(patsubst runtime/tests/fuzz_%.c,%,$(wildcard runtime/tests/fuzz_*.c))
build/runtime-fuzz/.configured: runtime/CMakeLists.txt $(VENV)/.deps
	@test -n "$(CLANG)" || { echo "make fuzz-c needs clang (Debian: apt-get install clang-14 libclang-rt-14-dev)"; exit 1; }
	CC=$(CLANG) cmake -S runtime -B build/runtime-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DTPURT_SANITIZE=address,undefined,fuzzer-no-link -DTPURT_FUZZ=ON -DTPURT_NATIVE=ON >/dev/null
	touch $@

fuzz-c: build/runtime-fuzz/.configured
	cmake --build build/runtime-fuzz --target $(addprefix fuzz_,$(FUZZ_HARNESSES))
	mkdir -p build/fuzz-crashes
	set -e; for h in $(FUZZ_HARNESSES); do \
	  mkdir -p build/fuzz-corpus/$$h; \
	  echo "== fuzz_$$h: $(FUZZ_SECONDS) s"; \
	  TORCH_TPU_HBM_LIMIT=256M TORCH_TPU_CACHE_DIR=$(CURDIR)/build/fuzz-kcache ASAN_OPTIONS=detect_leaks=1 \
	  build/runtime-fuzz/fuzz_$$h -max_total_time=$(FUZZ_SECONDS) -timeout=20 -rss_limit_mb=3072 -print_final_stats=1 \
	    -artifact_prefix=build/fuzz-crashes/$$h- build/fuzz-corpus/$$h runtime/tests/fuzz_corpus/$$h; \
	done

test-py: build
	$(PY) -m pytest -q tests

test: test-c test-c-asan test-py

test-full: test venv-full
	TORCH_TPU_TEST_FULL=1 $(PY) -m pytest -q tests
	$(PY) -m tests.conformance --quiet --jobs $(JOBS)
	$(PY) -m tests.hf --quiet

# The wheels are built from a copy of the committed sources (git archive), so
# the tree's build/ folders and .venv never leak into them. Both front ends use
# build isolation: the isolated environment gets pyproject.toml's build-system
# requirements, torch==2.13.0 among them (the same release the venv has).
WHEEL_TMP := build/wheel-src
wheel:
	rm -rf $(WHEEL_TMP) && mkdir -p $(WHEEL_TMP) dist
	git archive HEAD | tar -x -C $(WHEEL_TMP)
	cd $(WHEEL_TMP) && $(PYTHON) -m pip wheel . --no-deps -w $(CURDIR)/dist

# python -m build (PyPI `build`): an sdist of the copy, then the wheel built from
# that sdist (so a file missing from MANIFEST.in breaks it), into build/dist-build/;
# the front end comes from the venv (requirements.txt pins it)
BUILD_TMP := build/build-src
wheel-build: venv
	rm -rf $(BUILD_TMP) build/dist-build && mkdir -p $(BUILD_TMP)
	git archive HEAD | tar -x -C $(BUILD_TMP)
	cd $(BUILD_TMP) && $(CURDIR)/$(PY) -m build --outdir $(CURDIR)/build/dist-build

# each wheel (pip wheel's, python -m build's) installed into its own fresh venv
# next to torch==2.13.0, then the smoke test run from outside the source tree
test-wheel: wheel wheel-build
	set -e; for whl in $$(ls -t dist/torch_tpu-*.whl | head -1) $$(ls build/dist-build/torch_tpu-*.whl); do \
	  echo "== $$whl"; \
	  rm -rf build/wheel-venv && $(PYTHON) -m venv build/wheel-venv; \
	  build/wheel-venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0 $$whl; \
	  (cd /tmp && $(CURDIR)/build/wheel-venv/bin/python $(CURDIR)/tests/packaging/wheel_smoke.py); \
	done

N ?= 10000
SEED ?= 0
# compiled mode (torch.compile, backend="tpu") costs seconds a program: on every COMPILED_EVERY-th one
FUZZ_MODES ?= strict,defer,compiled
COMPILED_EVERY ?= 100
fuzz: build
	$(PY) -m tests.fuzz --seed $(SEED) --n $(N) --modes $(FUZZ_MODES) --compiled-every $(COMPILED_EVERY) \
	  --minimize --json build/fuzz-$(SEED)-$(N).json

soak: build
	$(PY) tests/test_soak.py --steps 1000

bench: build
	$(PY) -m bench
	$(PY) -m bench matrix sweep $(BENCH_PRESET)

# docs/_build/index.html links the pages; `$(PY) docs/build.py --serve` serves them
docs: build
	$(PY) docs/build.py

clean:
	rm -rf build torch_tpu/lib torch_tpu/_C*.so torch_tpu/.built
