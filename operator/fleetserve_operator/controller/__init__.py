"""The controller machinery: kopf wiring, the sync loop and the adapters to the API server.

Everything that runs, waits or talks to Kubernetes lives here; the domain packages beside it
(`spec`, `rollout`, `analysis`, the rendering and observing modules) decide without knowing
it, and never import it. Modules, highest first (a module imports only those below it; `|`:
independent):

    handlers | settings    kopf registration, the resync lane and the queue workers; the
                           operator's configuration and kopf's settings
    sync                   one reconcile: parse, observe, step the rollout, render, apply, report
    kube | leader | child_watch | service_watch | list_watch | metrics | workqueue
                           the API server (server-side apply, status, events); the Lease;
                           the child watches, the InferenceServices' own watch and the
                           list-watch loop under both; the operator's own metrics; the
                           work queue

Only `handlers` and `settings` know kopf; only `kube`, `leader`, `list_watch` and
`child_watch` know the `kubernetes` client.
"""
