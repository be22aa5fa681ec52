"""odb_packed: pack_collate, the block-diagonal attention of a packed row, and equality of
the packed and the padded computation (per-token losses, summed loss, gradients)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from helpers.tiny_lm import VOCAB, grads_of, loss_tokens, rel_err, seeded_samples, tiny_module
from odb_lightning.core.config import BatchingConfig, BatchingMode
from odb_lightning.data import QwenTokenizer
from odb_lightning.lit.datamodule import ODBDataModule
from odb_lightning.lit.module import CausalLMModule
from odb_lightning.lit.packed_inputs import block_causal_mask, body_inputs
from odb_lightning.runtime.batch import idle_sample, pack_collate, pad_collate
from odb_lightning.sample import IGNORE_INDEX


def sample(ids: list[int], labels: list[int] | None = None) -> dict[str, Tensor]:
    out = {"input_ids": torch.tensor(ids)}
    if labels is not None:
        out["labels"] = torch.tensor(labels)
    return out


SAMPLES = [
    sample([11, 12, 13], [-100, 12, 13]),
    sample([21, 22, 23, 24, 25], [21, -100, 23, 24, 25]),
    sample([31], [31]),
]


# -- pack_collate --------------------------------------------------------------------------
def test_pack_collate_shapes_and_values() -> None:
    batch = pack_collate(SAMPLES)
    assert "attention_mask" not in batch
    assert batch["input_ids"].tolist() == [[11, 12, 13, 21, 22, 23, 24, 25, 31]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 0]]
    assert batch["cu_seqlens"].tolist() == [0, 3, 8, 9]
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["max_seqlen"] == 5 and isinstance(batch["max_seqlen"], int)
    # First label of every sample masked: position 2 (last of sample 0) must not learn 21.
    assert batch["labels"].tolist() == [[-100, 12, 13, -100, -100, 23, 24, 25, -100]]
    for key in ("input_ids", "labels", "position_ids"):
        assert batch[key].shape == (1, 9) and batch[key].dtype == torch.long


def test_packing_keeps_the_supervised_token_count() -> None:
    per_sample = sum(int((s["labels"][1:] != IGNORE_INDEX).sum()) for s in SAMPLES)
    assert loss_tokens(pack_collate(SAMPLES)) == per_sample == 5
    assert loss_tokens(pad_collate(SAMPLES, pad_id=0)) == per_sample


def test_pack_collate_without_labels_single_idle_and_empty() -> None:
    batch = pack_collate([sample([7, 8]), sample([9, 10, 11])])
    assert batch["labels"].tolist() == [[-100, 8, -100, 10, 11]]  # every token but firsts
    idle = pack_collate([idle_sample(pad_id=3)])
    assert idle["input_ids"].tolist() == [[3]] and idle["labels"].tolist() == [[-100]]
    assert idle["cu_seqlens"].tolist() == [0, 1] and idle["max_seqlen"] == 1
    with pytest.raises(ValueError):
        pack_collate([])


def test_block_causal_mask() -> None:
    mask = block_causal_mask(torch.tensor([0, 2, 5, 6], dtype=torch.int32))
    assert mask.shape == (1, 1, 6, 6) and mask.dtype == torch.bool
    expected = [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    assert mask[0, 0].int().tolist() == expected


# -- the model on a packed row -------------------------------------------------------------
LENGTHS = [13, 7, 9, 4]  # 11 + 5 + 7 + 2 = 25 supervised tokens with a 2-token prompt


def random_samples(lengths: list[int]) -> list[dict[str, Tensor]]:
    return [{"input_ids": ids, "labels": labels} for ids, labels in seeded_samples(lengths)]


def logits_of(module: CausalLMModule, inputs: dict) -> Tensor:
    """Logits of every position, through the module's own attention path."""
    kwargs = body_inputs(inputs, module.model, module.hparams.attn_implementation)
    hidden = module.model.get_decoder()(**kwargs, use_cache=False).last_hidden_state
    return module.model.get_output_embeddings()(hidden)


def token_losses(module: CausalLMModule, inputs: dict) -> Tensor:
    """Cross-entropy of each supervised token, in sample order."""
    logits, targets = logits_of(module, inputs)[:, :-1], inputs["labels"][:, 1:]
    keep = targets != IGNORE_INDEX
    return F.cross_entropy(logits[keep], targets[keep], reduction="none")


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_packed_equals_padded_losses_and_gradients(attn_implementation: str) -> None:
    module = tiny_module(loss_chunk_tokens=6, attn_implementation=attn_implementation)
    samples = random_samples(LENGTHS)
    padded, packed = pad_collate(samples, pad_id=0), pack_collate(samples)
    with torch.no_grad():
        padded_tokens, packed_tokens = token_losses(module, padded), token_losses(module, packed)
    assert padded_tokens.numel() == packed_tokens.numel() == 25
    assert rel_err(packed_tokens, padded_tokens) <= 1e-5
    padded_sum, padded_count = module(padded)
    packed_sum, packed_count = module(packed)
    assert packed_count == padded_count == 25
    assert abs(float(packed_sum.detach() / padded_sum.detach()) - 1) <= 1e-5
    assert rel_err(grads_of(module, packed_sum), grads_of(module, padded_sum)) <= 1e-5


def logit_shifts(
    module: CausalLMModule, inputs: dict, bounds: list[int], target: int
) -> list[float]:
    """Per sample (``bounds`` = its boundaries in the row), the largest change of its
    logits when the tokens of sample ``target`` change."""
    changed = dict(inputs)
    changed["input_ids"] = inputs["input_ids"].clone()
    start, stop = bounds[target], bounds[target + 1]
    changed["input_ids"][0, start:stop] = (changed["input_ids"][0, start:stop] + 1) % VOCAB
    with torch.no_grad():
        delta = (logits_of(module, changed) - logits_of(module, inputs)).abs()[0]
    return [float(delta[a:b].max()) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def test_packed_samples_do_not_attend_to_each_other() -> None:
    module = tiny_module(loss_chunk_tokens=6)
    packed = pack_collate(random_samples(LENGTHS))
    bounds = packed["cu_seqlens"].tolist()
    shifts = logit_shifts(module, packed, bounds, target=1)
    assert shifts[1] > 1e-3  # its own logits change
    assert all(shifts[k] <= 1e-10 for k in (0, 2, 3))  # nobody else's
    # Control: the same row under a plain causal mask (no block structure) leaks sample 1
    # into the samples after it, so the check above can fail.
    causal = torch.ones(bounds[-1], bounds[-1], dtype=torch.bool).tril()[None, None]
    leaky = {key: packed[key] for key in ("input_ids", "labels", "position_ids")}
    shifts = logit_shifts(module, leaky | {"attention_mask": causal}, bounds, target=1)
    assert shifts[0] <= 1e-10  # causality alone protects the sample before it
    assert shifts[2] > 1e-3 and shifts[3] > 1e-3


def test_attention_layers_receive_the_block_mask_as_given() -> None:
    module = tiny_module(loss_chunk_tokens=6)
    packed = pack_collate(random_samples(LENGTHS))
    seen: list[Tensor] = []
    for layer in module.model.get_decoder().layers:
        layer.self_attn.register_forward_pre_hook(
            lambda _m, _args, kwargs: seen.append(kwargs["attention_mask"]), with_kwargs=True
        )
    module(packed)
    # transformers keeps a 4-D mask as it is, rather than building its own causal mask.
    expected = block_causal_mask(packed["cu_seqlens"])
    assert len(seen) == 2 and all(torch.equal(mask, expected) for mask in seen)


def test_flash_backends_get_varlen_kwargs_and_no_mask() -> None:
    module = tiny_module(loss_chunk_tokens=6)
    packed = pack_collate(SAMPLES)
    kwargs = body_inputs(packed, module.model, "flash_attention_2")
    assert set(kwargs) == {
        "input_ids",
        "position_ids",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
    }
    assert kwargs["cu_seq_lens_q"] is packed["cu_seqlens"] is kwargs["cu_seq_lens_k"]
    assert kwargs["max_length_q"] == kwargs["max_length_k"] == 5
    sdpa = body_inputs(packed, module.model, "sdpa")
    assert "cu_seqlens" not in sdpa and "max_seqlen" not in sdpa and "labels" not in sdpa
    assert sdpa["attention_mask"].shape == (1, 1, 9, 9)
    with pytest.raises(ValueError, match="packed rows"):
        body_inputs(packed, module.model, "flex_attention")


# -- the data module -----------------------------------------------------------------------
@pytest.mark.parametrize("mode", [BatchingMode.ODB_PACKED, BatchingMode.ODB])
def test_data_module_collates_by_mode(mode: BatchingMode) -> None:
    batching = BatchingConfig(mode=mode, token_budget=2048, outstanding_depth=16, num_workers=0)
    data = ODBDataModule(
        "synthetic",
        QwenTokenizer(),
        batching,
        regime="sharegpt_first_exchange",
        max_seq_len=1024,
        max_samples=24,
        val_samples=0,
    )
    data.setup("fit")
    loader = data.train_dataloader()
    try:
        batch = next(iter(loader))
    finally:
        data.teardown("fit")
    inputs, meta = batch.inputs, batch.meta
    lengths = [len(data.dataset[i]["input_ids"]) for i in meta.sample_ids]
    if mode is BatchingMode.ODB_PACKED:
        assert inputs["input_ids"].shape == (1, sum(lengths))
        assert inputs["position_ids"].shape == (1, sum(lengths))
        assert inputs["cu_seqlens"].tolist()[-1] == sum(lengths)
        assert "attention_mask" not in inputs
        assert meta.local_padded_tokens == meta.local_real_tokens == sum(lengths)
    else:
        assert inputs["input_ids"].shape == (len(lengths), max(lengths))
        assert "position_ids" not in inputs and "attention_mask" in inputs
    assert loss_tokens(inputs) == meta.local_loss_tokens
