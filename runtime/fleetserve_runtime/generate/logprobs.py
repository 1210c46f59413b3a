"""Log-probabilities of chosen tokens and of the most likely ones, batched over logit rows.

The distribution is the model's raw one: the log-softmax of the logits before temperature,
top-k or top-p (vLLM's default `logprobs_mode`), so the numbers describe the model and the
same prompt gets the same numbers whatever the request samples with; a greedy token is
always the most likely one. One call covers every row of a step that asked (the sampled
tokens' rows, and the prompt positions of sequences that asked for prompt
log-probabilities): one `log_softmax`, one `gather`, one `topk` as wide as the widest
request, one copy to the host.

`prompt_targets` says which prompt tokens a prefill chunk's rows predict: the logits at
position p score the token at p + 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from fleetserve_runtime.generate.contracts import TokenLogprob

__all__ = ["MAX_TOP_LOGPROBS", "prompt_targets", "token_logprobs"]

MAX_TOP_LOGPROBS = 20
"""Most alternatives one position may ask for (OpenAI's bound on `top_logprobs`)."""


def token_logprobs(
    logits: torch.Tensor,
    token_ids: Sequence[int],
    top: Sequence[int],
    decode: Callable[[int], str],
) -> list[TokenLogprob]:
    """Row n's `token_ids[n]` log-probability and its `top[n]` most likely tokens.

    `logits` is `[len(token_ids), vocab]`; `decode` gives a token's text. Alternatives come
    most likely first (ties in `torch.topk`'s order).
    """
    if len(token_ids) != logits.shape[0] or len(top) != logits.shape[0]:
        msg = f"{logits.shape[0]} logit rows for {len(token_ids)} tokens and {len(top)} widths"
        raise ValueError(msg)
    if not token_ids:
        return []
    if min(top) < 0 or max(top) > MAX_TOP_LOGPROBS:
        msg = f"top must lie in 0..{MAX_TOP_LOGPROBS}, got {min(top)}..{max(top)}"
        raise ValueError(msg)
    logp = torch.log_softmax(logits.float(), dim=-1)
    ids = torch.tensor(token_ids, dtype=torch.int64, device=logp.device)
    chosen = logp.gather(-1, ids[:, None])[:, 0].tolist()
    width = min(max(top), logp.shape[-1])
    values: list[list[float]] = [[] for _ in token_ids]
    indices: list[list[int]] = [[] for _ in token_ids]
    if width:
        best = torch.topk(logp, width, dim=-1)
        values, indices = best.values.tolist(), best.indices.tolist()
    return [
        TokenLogprob(
            token_id=token,
            token=decode(token),
            logprob=logprob,
            top=tuple(
                TokenLogprob(token_id=i, token=decode(i), logprob=v)
                for i, v in zip(row_ids[:k], row_values[:k], strict=True)
            ),
        )
        for token, logprob, k, row_ids, row_values in zip(
            token_ids, chosen, top, indices, values, strict=True
        )
    ]


def prompt_targets(tokens: Sequence[int], prompt_len: int, start: int, length: int) -> list[int]:
    """The prompt tokens the rows of a chunk at positions `start..start+length-1` predict.

    Row j scores `tokens[start + j + 1]`; rows past the prompt's second-to-last position
    predict no prompt token (the last one's logits sample the first output token), so the
    list may be shorter than `length`.
    """
    end = min(start + length, prompt_len - 1)
    return list(tokens[start + 1 : end + 1])
