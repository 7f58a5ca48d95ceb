# torch_tpu — build, run and test.
#   make run        main job (creates .venv, builds everything, trains minGPT on tpu: strict vs DeferAndFuse)
#   make demo       device tour (examples/demo.py)
#   make test       all tests CI runs: C tests (release + ASan/UBSan) and pytest
#   make build      venv + runtime + extension (incremental)
#   make bench      benchmarks (results printed and appended to BENCHMARKS.md), then the workload matrix
#                   and Llama size sweep (BENCH_PRESET=--quick by default, --full for realistic sizes)
#   make test-full  longer suites, OpInfo conformance of the whole database (tests/conformance/REPORT.md)
#   make wheel      dist/torch_tpu-*.whl built from a clean copy of the sources (pip wheel .)
#   make test-wheel that wheel installed into a fresh venv (with torch==2.13.0) + a smoke test
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
JOBS   ?= 2
BENCH_PRESET ?= --quick

RUNTIME_SRC := $(wildcard runtime/include/*.h runtime/src/*.c runtime/src/*.h runtime/src/*/*.c runtime/src/*/*.h runtime/CMakeLists.txt)
GLUE_SRC    := $(wildcard torch_tpu/csrc/*.cpp torch_tpu/csrc/*.h) setup.py

.PHONY: all venv build run demo test test-c test-c-asan test-py test-full bench clean wheel test-wheel

all: build

$(VENV)/.deps: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

venv: $(VENV)/.deps

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
	cmake -S runtime -B build/runtime -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	touch $@

build/runtime-asan/.configured: runtime/CMakeLists.txt $(VENV)/.deps
	cmake -S runtime -B build/runtime-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTPURT_SANITIZE=address,undefined >/dev/null
	touch $@

test-c: build/runtime/.configured
	cmake --build build/runtime
	ctest --test-dir build/runtime --output-on-failure -j$(JOBS)

test-c-asan: build/runtime-asan/.configured
	cmake --build build/runtime-asan
	ctest --test-dir build/runtime-asan --output-on-failure -j$(JOBS)

test-py: build
	$(PY) -m pytest -q tests

test: test-c test-c-asan test-py

test-full: test
	TORCH_TPU_TEST_FULL=1 $(PY) -m pytest -q tests
	$(PY) -m tests.conformance --quiet --jobs $(JOBS)

# The wheel is built from a copy of the committed sources (git archive), so
# the tree's build/ folders and .venv never leak into it.
WHEEL_TMP := build/wheel-src
wheel:
	rm -rf $(WHEEL_TMP) && mkdir -p $(WHEEL_TMP) dist
	git archive HEAD | tar -x -C $(WHEEL_TMP)
	cd $(WHEEL_TMP) && $(PYTHON) -m pip wheel . --no-deps -w $(CURDIR)/dist

test-wheel: wheel
	rm -rf build/wheel-venv && $(PYTHON) -m venv build/wheel-venv
	build/wheel-venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0 \
	  $$(ls -t dist/torch_tpu-*.whl | head -1)
	cd /tmp && $(CURDIR)/build/wheel-venv/bin/python $(CURDIR)/tests/packaging/wheel_smoke.py

bench: build
	$(PY) -m bench
	$(PY) -m bench matrix sweep $(BENCH_PRESET)

clean:
	rm -rf build torch_tpu/lib torch_tpu/_C*.so torch_tpu/.built
