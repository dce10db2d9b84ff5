# Two commands do everything on a fresh Debian machine with Python 3.11:
#   make run   - install what is missing, then run Redis, Triton + the gateway in the foreground
#   make test  - install what is missing, then run the whole test suite
# Installs are idempotent: a second run only checks a stamp file.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The npm clients the integration tests drive: openai, the Vercel AI SDK, the Codex CLI (pinned by the lock file).
JS_STAMP := tests/js/node_modules/.installed
# llama-cpp-python is built from source; a native (-march=native) build crashed on some
# CPUs, so build a portable one. uv caches the wheel (the --offline install below reuses it).
export CMAKE_ARGS := -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF

.PHONY: run test test-unit lint bench screenshots system-deps

run: $(STAMP) system-deps
	$(BIN)/gateway up

# The suite on TEST_WORKERS pytest-xdist workers (tests/conftest.py keeps the tests that share
# a stack on one), with lint and mypy beside it (niced: it takes the CPU the tests leave);
# lint's report is printed after the tests'.
# The Python and the npm installs run side by side (-j 2: npm waits on the network, uv on
# the disk). The project's modules are compiled first: the suite starts some twenty Python
# processes (workers, replicas, model stubs), which under PYTHONDONTWRITEBYTECODE would each
# compile them again (the installed packages are compiled by the install, see $(STAMP)).
# One collection then writes the test modules with pytest's assertions rewritten, while lint
# takes the other core: under PYTHONDONTWRITEBYTECODE (set on these machines) pytest caches
# none, and each worker rewrote them all again (8.5 s of CPU to collect against 4.7 s).
TEST_WORKERS ?= 4
test: system-deps
	@$(MAKE) --no-print-directory -j 2 $(STAMP) $(JS_STAMP)
	@$(BIN)/python -m compileall -q -j 0 gateway triton_repo tests > /dev/null
	@mkdir -p .run; nice -n 10 $(MAKE) --no-print-directory lint > .run/lint.log 2>&1 & lint=$$!; \
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest --collect-only -q -p no:cacheprovider > /dev/null; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder; tests=$$?; \
	wait $$lint; linted=$$?; cat .run/lint.log; \
	[ $$tests -eq 0 ] && [ $$linted -eq 0 ]

test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

lint: $(STAMP)
	$(BIN)/ruff check gateway tests triton_repo
	$(BIN)/ruff format --check gateway tests triton_repo
	$(BIN)/mypy
	$(BIN)/lint-imports

# NVIDIA's benchmark client (tests/bench/aiperf.py), for `make bench` only: a virtualenv of
# its own, as it brings pandas, transformers, dash and more that neither the gateway nor the
# tests need (and `make test` installs nothing of it).
AIPERF_VERSION := 0.13.0
AIPERF_VENV := .venv-aiperf
AIPERF_STAMP := $(AIPERF_VENV)/.installed
bench: $(STAMP) $(AIPERF_STAMP)
	$(BIN)/python -m tests.bench.chat
	$(BIN)/python -m tests.bench.batching
	$(BIN)/python -m tests.bench.audio
	$(BIN)/python -m tests.bench.audio_concurrency
	$(BIN)/python -m tests.bench.edge
	$(BIN)/python -m tests.bench.agents
	$(BIN)/python -m tests.bench.embeddings
	$(BIN)/python -m tests.bench.cpu
	$(BIN)/python -m tests.bench.peers
	$(BIN)/python -m tests.bench.scale
	$(BIN)/python -m tests.bench.voice
	$(BIN)/python -m tests.bench.multilingual
	$(BIN)/python -m tests.bench.priorities
	$(BIN)/python -m tests.bench.faults
	$(BIN)/python -m tests.bench.hostile
	$(BIN)/python -m tests.bench.stateless
	$(BIN)/python -m tests.bench.llmapi
	$(BIN)/python -m tests.bench.messages
	$(BIN)/python -m tests.bench.aiperf
	$(BIN)/python -m tests.bench.batches

# The playground screenshots of docs/playground.md (docs/playground/*.png), from a stack it starts.
screenshots: $(STAMP) system-deps
	$(BIN)/python -m tests.screenshots

# Debian packages, installed only when what they provide is missing (root or sudo).
# prometheus (with promtool) and prometheus-nginx-exporter are for the tests
# (tests/integration/test_monitoring_e2e.py starts its own on free ports); their packages'
# postinst would start them as system services (Prometheus on :9090), so on a systemd host
# the units of those it installs are masked first and nothing starts (`systemctl unmask`
# to run them as services). A container without an init runs no service anyway.
NO_SERVICE := prometheus prometheus-nginx-exporter
system-deps:
	@missing=""; \
	$(PYTHON) -c "import venv, ensurepip" 2>/dev/null || missing="$$missing python3-venv"; \
	$(PYTHON) -c "import sysconfig,os,sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'],'Python.h')))" || missing="$$missing python3-dev"; \
	command -v g++ >/dev/null || missing="$$missing g++"; \
	command -v make >/dev/null || missing="$$missing make"; \
	command -v redis-server >/dev/null || [ -x /usr/bin/redis-server ] || missing="$$missing redis-server"; \
	command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing="$$missing nginx"; \
	command -v docker-compose >/dev/null || missing="$$missing docker-compose"; \
	command -v node >/dev/null || missing="$$missing nodejs"; \
	command -v npm >/dev/null || missing="$$missing npm"; \
	command -v kubectl >/dev/null || missing="$$missing kubectl"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v espeak-ng >/dev/null || missing="$$missing espeak-ng"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v prometheus-nginx-exporter >/dev/null || missing="$$missing prometheus-nginx-exporter"; \
	if [ -n "$$missing" ]; then \
	  echo "Installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  for unit in $(NO_SERVICE); do \
	    case "$$missing " in *" $$unit "*) [ ! -d /run/systemd/system ] || \
	      $$SUDO systemctl mask -q $$unit.service 2>/dev/null || true;; esac; \
	  done; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BIN)/python:
	$(MAKE) system-deps
	$(PYTHON) -m venv $(VENV)

$(JS_STAMP): tests/js/package.json tests/js/package-lock.json | system-deps
	npm ci --prefix tests/js --no-audit --no-fund --loglevel=error
	touch $@

# uv installs the Python packages: it downloads them in parallel and builds llama-cpp-python
# from source meanwhile (`make run` on a fresh machine, the Debian packages already there:
# serving after 3 min 14 s on 2 cores, the build most of it), and installs what its cache
# holds in a second, compiling the bytecode on every core in 7 more (PYTHONDONTWRITEBYTECODE
# or not, every process of the suite then finds it). It is installed into the venv by pip,
# at the first install (a venv made before uv gets it at its next install: one already
# installed needs no network to run).
# --offline first: online, uv fetched llama-cpp-python's sdist again on every install here
# and built it again (minutes) though its cache held the wheel; offline, a cached install
# takes a second, anything missing from the cache fails it at once, before installing, and
# the online install follows (so an error shown is the online install's).
UV_VERSION := 0.13.9
UV_INSTALL := $(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode
# kokoro_ja's reading frontend, without its declared dictionary (see pyproject.toml).
JA_TEXT := pyopenjtalk-plus==0.4.1.post10 sudachipy==0.7.0
$(STAMP): pyproject.toml | $(BIN)/python
	$(MAKE) system-deps
	test -x $(BIN)/uv || $(BIN)/pip install -q uv==$(UV_VERSION)
	$(UV_INSTALL) --offline -e ".[models,dev]" 2>/dev/null || $(UV_INSTALL) -e ".[models,dev]"
	$(UV_INSTALL) --offline --no-deps $(JA_TEXT) 2>/dev/null || $(UV_INSTALL) --no-deps $(JA_TEXT)
	touch $@

# (make .venv-aiperf/.installed alone installs it, for python -m tests.bench.aiperf.)
$(AIPERF_STAMP): Makefile | $(STAMP)
	$(BIN)/uv venv -q --allow-existing --python $(BIN)/python $(AIPERF_VENV)
	$(BIN)/uv pip install -q --python $(AIPERF_VENV)/bin/python aiperf==$(AIPERF_VERSION)
	touch $@
