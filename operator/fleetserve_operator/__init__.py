"""Fleetserve operator: reconciles InferenceService objects into runtime Deployments.

Layers, highest first; a module imports only from layers below its own, and modules that
share a layer (`|`) do not import one another (import-linter checks this order):

    __main__ → handlers | settings → sync → kube | analysis | metrics | leader | child_watch
    → facts → observe | reconcile → podspec → rollout → contract → spec
    → naming | errors | records | workqueue

`sync` sequences one reconcile over the adapters (`kube`: the API server; `analysis`:
Prometheus, and the canary verdicts; `metrics`: the operator's own); `facts`, `observe`,
`reconcile`, `podspec` and `rollout` decide, without I/O; `spec` is the API; `records` holds
the plain data the layers hand each other. Outside the chain: `crdgen` and `docgen` (they
generate the CRD and the README's reference from `spec`) and `testing` (test doubles).
"""

__version__ = "0.1.0"
