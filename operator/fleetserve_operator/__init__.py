"""Fleetserve operator: reconciles InferenceService objects into runtime Deployments.

The folders are the architecture. `controller/` is the machinery: kopf wiring, the sync
loop, and the adapters to the API server (work queue, child watches, leader election, the
kube API, the operator's own metrics). Beside it, the domain decides without I/O of its
own: `spec/` is the API (the CRD's pydantic models), `rollout/` the state machine,
`analysis/` the canary verdicts from Prometheus, `render/` the desired children and
`observe/` what the cluster reports of the observed ones. No domain module imports the
controller.

Layers, highest first; a module imports only from layers below its own, and modules that
share a layer (`|`) do not import one another (import-linter checks this order, and that
every top-level module has its place):

    __main__ → controller → observe | render → rollout | analysis → contract → spec
    → naming | errors | records

`records` holds the plain data the layers hand each other. Outside the chain: `crdgen` and
`docgen` (they generate the CRD and its reference page from `spec`) and `testing` (test
doubles, and the simulated world the rollout's tests step through).
"""

__version__ = "0.1.0"
