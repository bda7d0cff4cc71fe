# gpupool: `make up` runs the embedded hub, `make test` runs every test.
# Each target does its own set-up on a fresh clone: a virtualenv in .venv, the
# Python package, and configurable-http-proxy and JupyterLab's extension builder from npm in ./node_modules.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP_FLAGS ?= -q --disable-pip-version-check
export PATH := $(CURDIR)/node_modules/.bin:$(CURDIR)/$(VENV)/bin:$(PATH)
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings

.PHONY: up test lint typecheck unit venv browser node cluster bench clean

up: venv
	$(VENV)/bin/gpupool up $(ARGS)

test: venv browser node cluster
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(MAKE) --no-print-directory typecheck
	$(PY) -m pytest $(PYTEST_ARGS)

unit: venv
	$(PY) -m pytest -m "not hub and not browser and not cluster" $(PYTEST_ARGS)

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# mypy on the product packages. The folders install under other names (pyproject's package-dir:
# hub_ext -> gpupool, spawner -> gpupool.spawner, ...) through the editable install's import hook,
# which static tools cannot follow. So mypy reads a tree of symlinks named as the package installs,
# remade on every run (folders come and go), in the ignored venv: gpupool/ holds a link to each entry
# of hub_ext/ plus links to the three other folders. Paths in mypy's messages are mapped back to the
# source folders by sed.
TYPES := $(VENV)/typecheck
typecheck: venv
	rm -rf $(TYPES) && mkdir -p $(TYPES)/gpupool
	for f in hub_ext/*; do ln -s $(CURDIR)/$$f $(TYPES)/gpupool/; done
	for d in spawner idle_culler widgets; do ln -s $(CURDIR)/$$d $(TYPES)/gpupool/$$d; done
	cd $(TYPES) && { $(CURDIR)/$(PY) -m mypy --config-file $(CURDIR)/pyproject.toml --cache-dir ../mypy-cache -p gpupool >log 2>&1; rc=$$?; \
	  sed -E 's#^gpupool/(spawner|idle_culler|widgets)/#\1/#; t; s#^gpupool/#hub_ext/#' log; exit $$rc; }

venv: node_modules/.installed $(VENV)/.installed

# the install builds the JupyterLab extension with @jupyterlab/builder from node_modules (setup.py)
LAB_SOURCES := widgets/labextension/package.json $(wildcard widgets/labextension/src/*.js widgets/labextension/schema/*.json)
$(VENV)/.installed: pyproject.toml setup.py node_modules/.installed $(LAB_SOURCES)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) --upgrade pip
	$(PY) -m pip install $(PIP_FLAGS) -e '.[test]'
	# JupyterLab defaults for a shared hub: start the kernel, no news pop-up
	mkdir -p $(LAB_SETTINGS) && cp hub_ext/lab/overrides.json $(LAB_SETTINGS)/overrides.json
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

# Debian's Chromium for the browser tests; installed where we may (root, as in CI).
browser:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "could not install Debian chromium"; \
	  else echo "chromium missing: apt-get install chromium (browser tests fail in CI, skip elsewhere)"; fi; \
	fi

# The real node of the cluster tests (tests/cluster/node.py): Debian's containerd, runc, CNI
# plugins, nftables and iptables, and debootstrap for its images; installed where we may (root,
# as in CI). Without them the `node` tests skip (and fail in CI).
NODE_PACKAGES := containerd runc containernetworking-plugins nftables iptables debootstrap
node:
	@if ! (command -v containerd && command -v runc && command -v nft && command -v iptables \
	       && command -v debootstrap && test -x /usr/lib/cni/bridge) >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(NODE_PACKAGES) >/dev/null) \
	      || echo "could not install $(NODE_PACKAGES)"; \
	  else echo "missing for the real node: apt-get install $(NODE_PACKAGES) (node tests fail in CI, skip elsewhere)"; fi; \
	fi

# The real control plane of the cluster tests (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok; Kueue and KAI-Scheduler for their own tests, which alone skip if they
# fail to build), built
# from Go modules at the pins in tests/cluster/go/ and cached under ~/.cache/gpupool: the first
# build takes minutes, later ones nothing until a pin changes.
cluster: venv
	@if command -v go >/dev/null 2>&1; then nice -n 10 $(PY) tests/cluster/build.py; \
	else echo "go missing: the cluster tests skip (and fail in CI)"; fi

bench: venv
	$(PY) -m benchmarks

# the Unix accounts a root `make up` made for its users go too (gpupool accounts --remove: those
# whose comment says `gpupool user <name>` and whose home is in ./state)
clean:
	@if [ -x $(VENV)/bin/gpupool ] && [ -d state ]; then $(VENV)/bin/gpupool accounts --remove --state state; fi
	rm -rf $(VENV) node_modules state test-artifacts gpupool.egg-info
