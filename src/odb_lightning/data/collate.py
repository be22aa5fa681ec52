"""Turn a list of samples into model inputs: padded rows, or one packed row.

Both take samples as produced by the datasets here (1-D ``input_ids`` and ``labels``);
``labels`` may be missing, in which case every token is a target.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from odb_lightning.data.sample import IGNORE_INDEX, Sample


def _labels(sample: Sample) -> torch.Tensor:
    labels = sample.get("labels")
    return sample["input_ids"] if labels is None else labels


def pad_collate(samples: Sequence[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad samples to the longest one in the batch.

    Args:
        samples: Non-empty list of samples.
        pad_id: Token id written into padding positions.

    Returns:
        ``input_ids`` ``[B, L]`` (long), ``attention_mask`` ``[B, L]`` (long, 1 = real
        token), ``labels`` ``[B, L]`` (long, ``-100`` in padding), ``L`` = longest sample.
    """
    if not samples:
        raise ValueError("pad_collate needs at least one sample")
    longest = max(sample["input_ids"].numel() for sample in samples)
    shape = (len(samples), longest)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    attention_mask = torch.zeros(shape, dtype=torch.long)
    labels = torch.full(shape, IGNORE_INDEX, dtype=torch.long)
    for row, sample in enumerate(samples):
        length = sample["input_ids"].numel()
        input_ids[row, :length] = sample["input_ids"]
        attention_mask[row, :length] = 1
        labels[row, :length] = _labels(sample)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def pack_collate(samples: Sequence[Sample]) -> dict[str, torch.Tensor | int]:
    """Concatenate samples into one padding-free row for varlen attention.

    Args:
        samples: Non-empty list of samples.

    Returns:
        ``input_ids``, ``labels``, ``position_ids``: ``[1, N]`` long, ``N`` = total tokens,
        positions restarting at 0 for every sample; ``cu_seqlens``: int32 ``[B + 1]``
        sample boundaries (``0, L0, L0 + L1, ...``) as flash-attention's varlen kernels
        expect; ``max_seqlen``: the longest sample, a Python int.
    """
    if not samples:
        raise ValueError("pack_collate needs at least one sample")
    lengths = [sample["input_ids"].numel() for sample in samples]
    input_ids = torch.cat([sample["input_ids"].long() for sample in samples])
    labels = torch.cat([_labels(sample).long() for sample in samples])
    cu_seqlens = torch.zeros(len(samples) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), dim=0)
    # The causal-LM loss is shifted: the logits at position t are scored against labels[t+1].
    # In a packed row, t = the last token of sample k and t+1 = the first token of sample
    # k+1, so an unmasked first label would train sample k's context to predict the next,
    # unrelated sample. Masking each sample's first label removes exactly those cross-boundary
    # targets and nothing else: a sample's first token has no context of its own, so it is
    # never a target in unpacked training either (supervised-token counts are unchanged).
    labels[cu_seqlens[:-1].long()] = IGNORE_INDEX
    starts = torch.repeat_interleave(cu_seqlens[:-1].long(), torch.tensor(lengths))
    position_ids = torch.arange(input_ids.numel()) - starts
    return {
        "input_ids": input_ids.unsqueeze(0),
        "labels": labels.unsqueeze(0),
        "position_ids": position_ids.unsqueeze(0),
        "cu_seqlens": cu_seqlens,
        "max_seqlen": max(lengths),
    }
