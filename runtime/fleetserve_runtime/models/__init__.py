"""Models: what the engines run, and nothing of the engines themselves.

Encoders: the handler protocol (`base`, the path user handlers implement), BERT sentence
encoders read from a Hugging Face directory (`bert`, `bert_directory`, `sentence_encoder`),
the built-in MiniLM among them (`minilm`), ONNX Runtime (`onnx_model`, `onnx_export`,
`minilm_onnx`), reduced precision (`quantize`, `accuracy`), TorchScript files (`serialized`)
and a synthetic model. Generative: the causal-LM protocol the generative engine steps
(`causal_lm`), the handler the registry loads (`generative`), the Llama family (`llama/`) and
a synthetic LM (`synthetic_lm`). `layouts` tells what a model directory holds, and
`registry` resolves model URIs to handlers and holds the loaded versions.
"""
