# gpupool: `make up` runs the embedded hub, `make test` runs every test.
# Each target does its own set-up on a fresh clone: a virtualenv in .venv, the
# Python package, and configurable-http-proxy and JupyterLab's extension builder from npm in ./node_modules.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP_FLAGS ?= -q --disable-pip-version-check
export PATH := $(CURDIR)/node_modules/.bin:$(CURDIR)/$(VENV)/bin:$(PATH)
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings

.PHONY: up test test-hub55 lint typecheck types-tree layers unit venv browser node cluster cluster-background postgres bench clean test-latest constraints docs

up: venv
	$(VENV)/bin/gpupool up $(ARGS)

# CLUSTER_BUILD=background: the control plane's Go build (minutes when its caches are cold) runs
# at nice 19 from right after the venv, beside the apt installs, lint, mypy and every test before
# the cluster's (pytest runs those last; their fixtures wait for a build in progress on
# tests/cluster/build.py's lock). Off by default until a cold CI run shows the hub tests' start
# timeouts hold beside it.
CLUSTER_BUILD ?= first
BACKGROUND := $(filter background,$(CLUSTER_BUILD))
test: venv $(if $(BACKGROUND),cluster-background) browser node $(if $(BACKGROUND),,cluster) postgres
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(MAKE) --no-print-directory typecheck
	$(MAKE) --no-print-directory layers
	$(PY) -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-hub55

# The real hub's spawn tests on JupyterHub 5.5.0 too (z2jh 4.4's hub image runs it; the venv has
# the constraints' 6.x): that release alone, laid over the venv on PYTHONPATH (~35 s).
HUB55 := $(VENV)/jupyterhub-5.5
test-hub55: venv
	test -f $(HUB55)/jupyterhub/__init__.py || $(PY) -m pip install $(PIP_FLAGS) --no-deps --target $(HUB55) jupyterhub==5.5.0
	PYTHONPATH=$(CURDIR)/$(HUB55) $(PY) -m pytest -q -p no:cacheprovider tests/test_hub_spawn.py $(PYTEST_ARGS)

unit: venv
	$(PY) -m pytest -m "not hub and not browser and not cluster and not release" $(PYTEST_ARGS)

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(MAKE) --no-print-directory layers

# mypy on the product packages. The folders install under other names (pyproject's package-dir:
# hub_ext -> gpupool, spawner -> gpupool.spawner, ...) through the editable install's import hook,
# which static tools cannot follow. So mypy reads a tree of symlinks named as the package installs,
# remade on every run (folders come and go), in the ignored venv: gpupool/ holds a link to each entry
# of hub_ext/ plus links to the three other folders. Paths in mypy's messages are mapped back to the
# source folders by sed.
TYPES := $(VENV)/typecheck
types-tree: venv
	rm -rf $(TYPES) && mkdir -p $(TYPES)/gpupool
	for f in hub_ext/*; do ln -s $(CURDIR)/$$f $(TYPES)/gpupool/; done
	for d in spawner idle_culler widgets; do ln -s $(CURDIR)/$$d $(TYPES)/gpupool/$$d; done

# the layer contract in pyproject.toml ([tool.importlinter]), read by import-linter from the same tree
layers: types-tree
	cd $(TYPES) && PYTHONPATH=. $(CURDIR)/$(VENV)/bin/lint-imports --no-cache $(CURDIR)/pyproject.toml

typecheck: types-tree
	cd $(TYPES) && { $(CURDIR)/$(PY) -m mypy --config-file $(CURDIR)/pyproject.toml --cache-dir ../mypy-cache -p gpupool >log 2>&1; rc=$$?; \
	  sed -E 's#^gpupool/(spawner|idle_culler|widgets)/#\1/#; t; s#^gpupool/#hub_ext/#' log; exit $$rc; }

venv: node_modules/.installed $(VENV)/.installed
	@# the cgroup v2 device program's helper (hub_ext/contain/devfilter.py), from Go modules where Go is
	@# installed; cached per pin, so a warm run only checks (else the hub builds it when it needs it)
	@if command -v go >/dev/null 2>&1; then $(PY) -c 'from gpupool.contain.devfilter import build; build()' || \
	  echo "warning: no cgroup v2 device helper; the hub says so at start where it needs one"; fi

# the install builds the JupyterLab extension with @jupyterlab/builder from node_modules (setup.py).
# Every dependency at the version CI tests (requirements/constraints.txt): a fresh clone gets the
# tested set, not whatever was released this morning; `make test-latest` tries the newest.
CONSTRAINTS := requirements/constraints.txt
LAB_SOURCES := widgets/labextension/package.json $(wildcard widgets/labextension/src/*.js widgets/labextension/schema/*.json)
$(VENV)/.installed: pyproject.toml setup.py $(CONSTRAINTS) node_modules/.installed $(LAB_SOURCES)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) --upgrade pip
	$(PY) -m pip install $(PIP_FLAGS) -c $(CONSTRAINTS) -e '.[test]'
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

# Debian's PostgreSQL server for the store's tests on a real PostgreSQL (tests/support/postgres.py
# starts a throwaway cluster with its initdb and pg_ctl); installed where we may (root, as in CI).
# Without it those tests skip (and fail in CI).
postgres:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
	      || echo "could not install Debian postgresql"; \
	  else echo "postgresql missing: apt-get install postgresql (its store tests fail in CI, skip elsewhere)"; fi; \
	fi

# The real control plane of the cluster tests (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok; Kueue and KAI-Scheduler for their own tests, which alone skip if they
# fail to build), built
# from Go modules at the pins in tests/cluster/go/ and cached under ~/.cache/gpupool: the first
# build takes minutes, later ones nothing until a pin changes.
cluster: venv
	@if command -v go >/dev/null 2>&1; then nice -n 10 $(PY) tests/cluster/build.py; \
	else echo "go missing: the cluster tests skip (and fail in CI)"; fi

cluster-background: venv
	@mkdir -p test-artifacts
	@if command -v go >/dev/null 2>&1; then \
	  nohup nice -n 19 $(PY) tests/cluster/build.py >test-artifacts/cluster-build.log 2>&1 </dev/null & \
	  echo "building the control plane in the background: test-artifacts/cluster-build.log"; \
	else echo "go missing: the cluster tests skip (and fail in CI)"; fi

# The newest versions pyproject allows, in a venv of their own (.venv-latest), against a quick
# subset: the unit tests and one real hub. Run before refreshing the constraints (and on a
# schedule in CI), so an upstream release that breaks gpupool is seen before users install it.
LATEST := .venv-latest
test-latest: node_modules/.installed
	rm -rf $(LATEST) && python3 -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(LATEST)/bin/python -m pip install $(PIP_FLAGS) --upgrade --upgrade-strategy eager -e '.[test,docs]'
	$(LATEST)/bin/python -m pip list --disable-pip-version-check | grep -i -E '^(jupyterhub|jupyterlab|notebook|jupyterhub-kubespawner) '
	$(LATEST)/bin/python -m pytest -q -m "not hub and not browser and not cluster and not node and not release" \
	  tests/test_namespace.py tests/test_config.py tests/test_pool_units_quotas.py tests/test_spawner_parts.py $(PYTEST_ARGS)
	$(LATEST)/bin/python -m pytest -q tests/test_hub_spawn.py $(PYTEST_ARGS)

# Refresh the tested set: what the newest allowed versions resolve to today (run `make test` after).
constraints: test-latest
	{ sed -n '1,2p' $(CONSTRAINTS); $(LATEST)/bin/python -m pip freeze --exclude-editable --disable-pip-version-check | sort -f; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)

# The docs site (Sphinx + MyST, docs/conf.py) in docs/_build/html, the README its first page; the
# options reference is written from the code first. Warnings are errors: a broken link between
# pages or to a heading fails the build (links to other sites are not checked: no network in CI).
# Sphinx and MyST are the `docs` extra, installed at the tested versions on first use; not part
# of `make test` (tests/test_options_reference.py and tests/test_docs_site.py are, in seconds).
DOCS_EXTRA = $(shell python3 -c "import tomllib; print(' '.join(repr(r) for r in tomllib.load(open('pyproject.toml','rb'))['project']['optional-dependencies']['docs']))")
$(VENV)/.docs-installed: pyproject.toml $(CONSTRAINTS) $(VENV)/.installed
	$(PY) -m pip install $(PIP_FLAGS) -c $(CONSTRAINTS) $(DOCS_EXTRA)
	touch $@

docs: $(VENV)/.docs-installed
	$(PY) docs/options_reference.py
	rm -rf docs/_build
	$(PY) -m sphinx -q -W --keep-going -b html docs docs/_build/html
	@echo "the site: docs/_build/html/index.html"

bench: venv
	$(PY) -m benchmarks

# the Unix accounts a root `make up` made for its users go too (gpupool accounts --remove: those
# whose comment says `gpupool user <name>` and whose home is in ./state)
clean:
	@if [ -x $(VENV)/bin/gpupool ] && [ -d "$$($(PY) -c 'from gpupool.host.system_env import default_state; print(default_state())')" ]; then \
	  $(VENV)/bin/gpupool accounts --remove; fi
	@# as root: the users' environment in /opt/gpupool/<key> and a state folder in /var/lib/gpupool/<key>
	@if [ -x $(PY) ] && [ "$$(id -u)" = 0 ]; then $(PY) -m gpupool.host.system_env; fi
	rm -rf $(VENV) $(LATEST) node_modules state test-artifacts gpupool.egg-info docs/_build
