"""Chunked LM head: cross-entropy of the supervised positions only, without full logits.

A causal LM predicts token ``t + 1`` from the hidden state at ``t``, so the loss needs the
head only where ``labels[t + 1]`` is supervised. Full logits of a 16k-token batch against
a 152k vocabulary would be 16k x 152k floats (about 10 GB in float32), kept with their
log-softmax for backward. Here the supervised rows are gathered first, then pushed through
the head in chunks of ``chunk_tokens`` rows, each under activation checkpointing: backward
recomputes one chunk's logits at a time, so the peak is ``chunk_tokens x vocab`` whatever
the batch size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from odb_lightning.sample import IGNORE_INDEX, supervised_targets


def chunked_lm_loss(
    hidden: Tensor,
    labels: Tensor,
    lm_head: nn.Module,
    chunk_tokens: int,
    num_loss_tokens: int | None = None,
) -> tuple[Tensor, int]:
    """Summed token cross-entropy of a causal LM.

    Args:
        hidden: Final hidden states ``[..., L, H]`` (after the body's last norm).
        labels: Targets ``[..., L]`` aligned with the inputs, ``-100`` where unsupervised;
            position ``t`` is scored against ``labels[..., t + 1]``.
        lm_head: Maps ``[n, H]`` to logits ``[n, V]``.
        chunk_tokens: Most rows sent through the head at once.
        num_loss_tokens: The supervised-token count when the caller knows it (the step
            metadata counts it on the host): the rows are then gathered with a
            fixed-size index, without the device-to-host copy that a boolean index costs
            (the host would wait for the whole forward before queueing the head and the
            backward). It must be right; :func:`loss_token_mismatch` checks it lazily.

    Returns:
        ``(loss_sum, num_loss_tokens)``: the sum (not the mean) of the token losses, in at
        least float32, and how many tokens it covers. With no supervised token the sum is a
        zero that still depends on the head, so that every parameter takes part in backward
        (DDP expects a gradient for each one, including an untied head).
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    targets = labels[..., 1:]
    supervised = supervised_targets(labels)
    # Gather the rows that reach the head: [n, H] instead of [..., L, H].
    if num_loss_tokens is None:
        rows = hidden[..., :-1, :][supervised]
        targets = targets[supervised]
        num_loss_tokens = targets.numel()
    else:
        # Indices into the flattened [..., L] positions (the last one never supervised),
        # so that hidden is read as the view it is, not copied without its last position.
        where = F.pad(supervised, (0, 1), value=False).reshape(-1)
        # fill_value 0 keeps a wrong count in range; loss_token_mismatch reports it.
        index = torch.nonzero_static(where, size=num_loss_tokens, fill_value=0).squeeze(1)
        rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)
        targets = F.pad(targets, (0, 1), value=IGNORE_INDEX).reshape(-1).index_select(0, index)
    if num_loss_tokens == 0:
        return _upcast(lm_head(hidden[..., :1, :])).sum() * 0.0, 0
    loss_sum = None
    for start in range(0, num_loss_tokens, chunk_tokens):
        stop = start + chunk_tokens
        chunk = checkpoint(
            _chunk_loss, lm_head, rows[start:stop], targets[start:stop], use_reentrant=False
        )
        loss_sum = chunk if loss_sum is None else loss_sum + chunk
    return loss_sum, num_loss_tokens


def loss_token_mismatch(labels: Tensor, num_loss_tokens: int) -> Tensor:
    """A device-side 0/1: whether ``labels`` supervise other than ``num_loss_tokens`` tokens.
    Summed over micro-batches and read once per optimizer step, not once per batch."""
    return (supervised_targets(labels).sum() != num_loss_tokens).to(torch.int32)


def _chunk_loss(lm_head: nn.Module, rows: Tensor, targets: Tensor) -> Tensor:
    """Summed cross-entropy of one chunk; its logits live only inside this call."""
    return F.cross_entropy(_upcast(lm_head(rows)), targets, reduction="sum")


def _upcast(logits: Tensor) -> Tensor:
    """Softmax in at least float32: bf16 logits lose the tail of a 152k-way softmax."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))
