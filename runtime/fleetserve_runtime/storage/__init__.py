"""The storage initializer: fetch a model from object storage into a volume, all or nothing.

`fleetserve-runtime fetch` (`command`) runs in an init container, before the runtime, with
the same image: it fetches the model a URI names (`s3://`, `oci://`, `https://`, `hf://`;
`uri`) into `<dest>/model`, with a record in `<dest>/model.json` (`install`), and the
runtime then serves `file://<dest>/model` from the volume, mounted read-only.

Modules, each importing only those below it (`make lint` checks this, and that the package
imports nothing of the serving side: server, serving, the engines, the models):

- `command`: flags to options, JSON-line events, the termination log.
- `fetch`: one fetch end to end; it imports a scheme's fetcher only when asked for it.
- `https`, `s3`, `oci`, `hf`: one fetcher a scheme, each mapping its client's errors to the
  named reasons (httpx2, MinIO, oras and requests, huggingface_hub).
- `archive`: safe unpacking of tar and zip; `credentials`: the mounted Secret; `tls`: trust.
- `context`: what a fetcher is given; `install`: the volume's layout and the atomic install;
  `staging`: safe paths and hashed writes; `budget`: `--max-bytes`; `progress`: events;
  `options`: the settings; `uri`: parsing; `digests`: digests and the tree digest;
  `reasons`: the failure reasons; `redact`: no credentials in any message.

The reference page is docs/reference/model-storage.md.
"""
