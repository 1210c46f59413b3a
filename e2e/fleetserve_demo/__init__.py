"""The full-fleet demo (`make demo`): a live canary rollout and an automatic rollback.

It starts the local control plane and Prometheus (the e2e harness, `fleetserve_e2e`), runs the
operator as a process under the chart's RBAC, serves MiniLM on the GPU track with a CPU
fallback, drives live traffic, promotes a good version step by step and rolls a bad one back,
then leaves the fleet running for a look around (or exits with `--exit`, for CI).
"""
