"""The generative engine: continuous batching of causal-LM steps over a paged KV cache.

It steps any `models.causal_lm.CausalLM` (the Llama forward in `models.llama`, or the
synthetic model in `models.synthetic_lm`) and knows no model's code. The parts, each in its
own module (`contracts` names the requests and events that pass to and from its callers):

- `blocks`, `sequence`, `kv_manager`, `scheduler`, `stops` (pure): which blocks a sequence
  holds (shared prompt prefixes by hash, reference-counted), which sequences run, prefill or
  are preempted in the next step under the token budget, and where a stop string cuts the
  text.
- `sampling`: per-request greedy, temperature, top-k, top-p and seeded sampling of the logits.
- `metrics`: the engine's Prometheus series (tokens, steps, KV blocks, streams).
- `request`, `stream`: one request's state on the worker thread, and its events as the
  caller reads them on the event loop.
- `prompts`, `output`: a request's prompt to checked token ids at the door; each sampled
  token to text deltas and finish events.
- `engine_core`: the worker thread's loop of steps (schedule, run the model, process outputs).
- `engine` (with its knobs in `limits`): the event loop's side, which admits requests and
  starts and stops the worker.
"""
