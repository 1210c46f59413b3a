"""Fleetserve operator: reconciles InferenceService objects into runtime Deployments.

Layers, highest first; a module imports only from layers below its own, and modules that
share a layer (`|`) do not import one another (import-linter checks this order):

    __main__ → handlers | settings → sync → allowlist → kube | analysis | metrics → facts
    → observe | reconcile → podspec → rollout → contract → spec → naming | errors | records

`sync` sequences one reconcile over the adapters (`kube`: the API server; `analysis`:
Prometheus; `metrics`: the operator's own); `facts`, `observe`, `reconcile`, `podspec` and
`rollout` decide, without I/O; `spec` is the API; `records` holds the plain data the layers
hand each other. Outside the chain: `crdgen` and `docgen` (they generate the CRD and the
README's reference from `spec`), `sequential` (the anytime-valid tests `analysis` runs:
pure arithmetic, importing nothing of the operator) and `testing` (test doubles).
"""

__version__ = "0.1.0"
