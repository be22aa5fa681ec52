"""Model inputs of a packed row (``odb_packed``): samples packed in one row must not
attend to each other, and each backend takes that boundary in its own form."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel

FLASH_VARLEN_BACKENDS = frozenset({"flash_attention_2", "flash_attention_3"})
"""``transformers`` attention backends that take packed-row boundaries as varlen kwargs."""


def body_inputs(
    inputs: Mapping[str, Tensor | int], model: PreTrainedModel, attn_implementation: str
) -> dict[str, Any]:
    """Keyword arguments of the decoder body: every input but ``labels``, with the
    boundaries of a packed row (``cu_seqlens``, ``max_seqlen``) in the backend's form.

    ``flash_attention_2/3`` get them as ``cu_seq_lens_q/k`` and ``max_length_q/k`` (the
    varlen kernel; covered only where flash-attn is installed); ``sdpa`` gets
    :func:`block_causal_mask`, ``eager`` the same mask as an additive one (0 or the
    dtype's min). How ``transformers`` takes each form: ``docs/design.md``, "Packed rows
    and the attention backends".

    Raises:
        ValueError: For another backend, or a model with sliding-window layers without
            flash attention.
    """
    body = {k: v for k, v in inputs.items() if k not in ("labels", "cu_seqlens", "max_seqlen")}
    if "cu_seqlens" not in inputs:
        return body
    cu_seqlens, max_seqlen = inputs["cu_seqlens"], int(inputs["max_seqlen"])
    if attn_implementation in FLASH_VARLEN_BACKENDS:
        varlen = {"cu_seq_lens_q": cu_seqlens, "cu_seq_lens_k": cu_seqlens}
        return body | varlen | {"max_length_q": max_seqlen, "max_length_k": max_seqlen}
    if attn_implementation not in ("sdpa", "eager"):
        raise ValueError(
            f"packed rows need sdpa, eager or flash attention, not {attn_implementation}"
        )
    if "sliding_attention" in (getattr(model.config, "layer_types", None) or ()):
        raise ValueError("the packed-row mask has no sliding window: use flash attention")
    allowed = block_causal_mask(cu_seqlens)
    if attn_implementation == "sdpa":
        return body | {"attention_mask": allowed}
    # eager adds the mask to the scores: the dtype's min makes a blocked weight exp(.) = 0.
    additive = torch.zeros(allowed.shape, dtype=model.dtype, device=allowed.device)
    additive.masked_fill_(~allowed, torch.finfo(model.dtype).min)
    return body | {"attention_mask": additive}


def block_causal_mask(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Boolean attention mask of a packed row: causal inside each sample, nothing across.

    Query ``q`` may attend to key ``k`` iff both lie in the same sample and ``k <= q``:
    the mask is block-diagonal, one lower-triangular block per sample, so a packed row
    computes exactly what the same samples compute as separate rows. It is dense,
    ``N x N`` bytes (``N = cu_seqlens[-1]``): beyond a few thousand tokens per row use a
    varlen kernel (``flash_attention_2``), which takes ``cu_seqlens`` instead.

    Args:
        cu_seqlens: int ``[B + 1]`` sample boundaries, as ``pack_collate`` makes them.

    Returns:
        bool ``[1, 1, N, N]``, ``True`` where attention is allowed.
    """
    lengths = cu_seqlens.diff().long()
    num_tokens = int(cu_seqlens[-1])
    sample_of = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=cu_seqlens.device), lengths, output_size=num_tokens
    )
    mask = sample_of[:, None] == sample_of[None, :]
    return mask.tril_()[None, None]
