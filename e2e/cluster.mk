# Local control plane and Prometheus for e2e tests and the demo.
# Included by the top-level Makefile, which defines VENV, PY and `setup` (installing
# requirements/e2e.txt).  Standalone: make -f e2e/cluster.mk VENV=.venv PY=.venv/bin/python <target>

E2E_HARNESS := env PYTHONPATH=e2e $(PY) -m fleetserve_e2e
# Which program runtime pods run: `venv` (the repo's fleetserve-runtime) or `standin`.
E2E_RUNTIME ?= venv
E2E_PYTEST_ARGS ?=

.PHONY: tools keda-tools storage-tools gateway-tools prometheus-install cluster-up cluster-down \
        prometheus-up prometheus-down e2e-harness e2e-gateway

##@ Local cluster (e2e/cluster.mk), and the harness's own e2e tier

## tools: build kube-apiserver, etcd, controller-manager, scheduler, kubectl, helm (once, cached)
tools: setup
	nice -n 10 $(E2E_HARNESS) tools

## keda-tools: build KEDA's operator and metrics API server from e2e/keda-tools (once, cached)
keda-tools: setup
	nice -n 10 $(E2E_HARNESS) keda-tools

## storage-tools: build SeaweedFS's weed (S3) and Distribution's registry (OCI) from
##                e2e/storage-tools (once, cached)
storage-tools: setup
	nice -n 10 $(E2E_HARNESS) storage-tools

## gateway-tools: build Traefik (the Gateway API data plane of e2e-gateway) from
##                e2e/gateway-tools (once, cached)
gateway-tools: setup
	nice -n 10 $(E2E_HARNESS) gateway-tools

## prometheus-install: Debian's prometheus package, if missing (the daemon is not started)
prometheus-install:
	@command -v prometheus >/dev/null || { apt-get update && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; }

## cluster-up: start a background cluster; prints KUBECONFIG=<path>
cluster-up: setup tools
	$(E2E_HARNESS) cluster-up --runtime=$(E2E_RUNTIME)

## cluster-down: stop the background cluster (and its Prometheus)
cluster-down:
	$(E2E_HARNESS) cluster-down

## prometheus-up: start a background Prometheus scraping the cluster's pods; prints PROMETHEUS_URL
prometheus-up: cluster-up prometheus-install
	$(E2E_HARNESS) prometheus-up

## prometheus-down: stop the background Prometheus
prometheus-down:
	$(E2E_HARNESS) prometheus-down

## e2e-harness: the harness's own e2e tests (starts its own clusters; needs no cluster-up)
e2e-harness: setup tools keda-tools prometheus-install
	timeout 1200 $(PY) -m pytest e2e/harness --e2e-runtime=$(E2E_RUNTIME) $(E2E_PYTEST_ARGS)

## e2e-gateway: the canary split Traefik enforces from the operator's HTTPRoute and GRPCRoute (not in `make test`)
e2e-gateway: setup tools gateway-tools
	cd e2e && timeout 900 ../$(PY) -m pytest gateway_e2e -s $(E2E_PYTEST_ARGS)
