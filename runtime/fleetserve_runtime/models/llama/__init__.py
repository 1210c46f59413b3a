"""Llama-family decoders: our own forward over paged KV blocks, and everything that loads one.

- `config`: the architecture (`LlamaConfig`) and a loaded `Checkpoint`.
- `checkpoint`, `tokenizer`, `chat_template`: a checkpoint (a GGUF file, or a directory with
  `config.json`, `*.safetensors` and `tokenizer.json`) to a `Checkpoint`: the architecture,
  fp32 weights under the usual Llama parameter names, and a `models.causal_lm.TextCodec`.
  `checkpoint` dispatches by format: `gguf_checkpoint` (with `gguf_bounds` and
  `gguf_weights`) or `directory_checkpoint` (with `safetensors_weights`), both checked by
  `checkpoint_checks`.
- `model`, `kv_cache`: the Llama forward over a preallocated pool of fixed-size KV blocks (a
  `models.causal_lm.CausalLM`); each step runs a flat batch of sequence chunks (prefill chunks
  and single decode tokens together) and returns the logits of each chunk's last token.

The generative engine (`generate`) steps it through the `CausalLM` protocol only.
"""
