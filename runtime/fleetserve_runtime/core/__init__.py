"""The runtime's core, below every engine and the edge: what all of them share.

`config` (the settings), `metrics` (every Prometheus series, named once), `memory` (the
device memory budget and buffer pool), `cache` (the result cache), `errors` (the domain
errors the edge maps to statuses), `logs`, `limits`, `liveness` (heartbeats and stuck-worker
verdicts), `auth` (token files, allowlists), `json_limits` (bounded JSON parsing),
`priority` (the request priority classes both engines schedule by) and `queueing` (the
queue bound, timeouts and priority aging both engines admit by). Only the standard library,
pydantic, prometheus-client and, in `memory`, torch.
"""
