"""Attention inputs of the decoder body: what each ``transformers`` backend needs so that a
padded batch runs its fastest kernel and the samples of a packed row (``odb_packed``) do
not attend to each other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from odb_lightning.core.rows import StepShape

try:
    from transformers.utils.generic import is_flash_attention_requested
except ImportError:  # transformers < 5: the flash backends are named flash_attention_*

    def is_flash_attention_requested(*, requested_attention_implementation: str) -> bool:
        return "flash" in requested_attention_implementation


NOT_BODY_INPUTS = ("labels", "cu_seqlens", "max_seqlen")
"""Batch keys the decoder body does not take (the loss's, and the packed row's bounds)."""


def uses_flash_varlen(attn_implementation: str) -> bool:
    """A flash-attention backend (``flash_attention_2/3/4`` or a hub flash kernel such as
    ``kernels-community/flash-attn3``): it takes a packed row's bounds as varlen kwargs."""
    return is_flash_attention_requested(requested_attention_implementation=attn_implementation)


def body_inputs(
    inputs: Mapping[str, Tensor | int], attn_implementation: str, *, right_padded: bool = False
) -> dict[str, Any]:
    """Keyword arguments of the decoder body: every input but ``labels`` and the packed
    bounds, in the form the attention backend runs fastest.

    * **Padded batch, right padded** (``right_padded``: what
      :func:`~odb_lightning.runtime.batch.pad_collate` makes): no ``attention_mask``. Padding
      sits after every real token, so causal attention alone gives the real tokens the
      states they would get with the mask, and without a mask ``sdpa`` keeps its flash and
      memory-efficient kernels (a 4-D mask would push it to the masked path). Padding
      positions are never scored.
    * **Packed row** (``cu_seqlens`` present): ``position_ids`` restart at 0 for every
      sample and there is no ``attention_mask``; ``transformers`` derives the sample
      boundaries from the positions. Flash backends also get ``cu_seq_lens_q/k`` and
      ``max_length_q/k`` (the varlen kernel, without a device-to-host copy to find them);
      ``flex_attention`` builds a block-sparse mask; ``sdpa`` and ``eager`` build a dense
      ``N x N`` block mask, the last resort, which the budget charges as ``N**2``
      (``batching.rows.packed_attention=dense``).

    Raises:
        ValueError: A packed row with an ``attention_mask`` (``transformers`` then takes the
            mask as given and ignores the boundaries in ``position_ids``: the samples would
            attend to each other), or without ``position_ids``.
    """
    body = {k: v for k, v in inputs.items() if k not in NOT_BODY_INPUTS}
    if "cu_seqlens" not in inputs:
        if right_padded:
            body.pop("attention_mask", None)
        return body
    if "attention_mask" in body:
        raise ValueError(
            "a packed row (cu_seqlens) must not carry an attention_mask: with one, "
            "transformers ignores the sample boundaries in position_ids and the packed "
            "samples attend to each other"
        )
    if "position_ids" not in body:
        raise ValueError("a packed row (cu_seqlens) needs position_ids restarting per sample")
    if uses_flash_varlen(attn_implementation):
        cu_seqlens, max_seqlen = inputs["cu_seqlens"], int(inputs["max_seqlen"])
        varlen = {"cu_seq_lens_q": cu_seqlens, "cu_seq_lens_k": cu_seqlens}
        return body | varlen | {"max_length_q": max_seqlen, "max_length_k": max_seqlen}
    return body


def one_row_inputs(tokens: int, device: torch.device) -> dict[str, Any]:
    """The inputs that make a ``[1, tokens]`` batch one packed row of a single sample
    (positions, bounds), as :func:`~odb_lightning.runtime.batch.pack_collate` gives them."""
    return {
        "position_ids": torch.arange(tokens, device=device)[None],
        "cu_seqlens": torch.tensor([0, tokens], dtype=torch.int32, device=device),
        "max_seqlen": tokens,
    }


def warmup_batch(shape: StepShape, vocab_size: int, device: torch.device) -> dict[str, Any]:
    """Inputs of one warm-up step: random ids, every target supervised."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (shape.rows, shape.tokens), generator=generator)
    inputs: dict[str, Any] = {"input_ids": ids.to(device), "labels": ids.clone().to(device)}
    if shape.one_row:
        inputs |= one_row_inputs(shape.tokens, device)
    return inputs
