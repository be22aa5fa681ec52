"""odb_packed: pack_collate, the block-diagonal attention of a packed row, and equality of
the packed and the padded computation (per-token losses, summed loss, gradients)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from helpers.tiny_lm import VOCAB, grads_of, loss_tokens, rel_err, seeded_samples, tiny_module
from odb_lightning.core.config import BatchingConfig
from odb_lightning.data import QwenTokenizer
from odb_lightning.lit.data.datamodule import ODBDataModule
from odb_lightning.lit.model.attention_inputs import body_inputs
from odb_lightning.lit.model.module import CausalLMModule
from odb_lightning.runtime.batch import StepMeta, idle_sample, pack_collate, pad_collate
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


def test_pack_collate_pads_the_row_to_a_multiple_with_a_segment_of_its_own() -> None:
    batch = pack_collate(SAMPLES, pad_to_multiple_of=4, pad_id=0)
    assert batch["input_ids"].tolist() == [[11, 12, 13, 21, 22, 23, 24, 25, 31, 0, 0, 0]]
    # The padding restarts its positions: its own sample to the attention.
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 0, 0, 1, 2]]
    assert batch["cu_seqlens"].tolist() == [0, 3, 8, 9, 12]
    assert batch["labels"][0, 9:].tolist() == [-100] * 3
    assert loss_tokens(batch) == loss_tokens(pack_collate(SAMPLES)) == 5
    assert pack_collate(SAMPLES, pad_to_multiple_of=9)["input_ids"].shape == (1, 9)
    padded = pad_collate(SAMPLES, pad_id=0, pad_to_multiple_of=4)
    assert padded["input_ids"].shape == (3, 8) and loss_tokens(padded) == 5


# -- the model on a packed row -------------------------------------------------------------
LENGTHS = [13, 7, 9, 4]  # 11 + 5 + 7 + 2 = 25 supervised tokens with a 2-token prompt
# flex_attention compiles its kernel (tens of seconds on two cores) and has no CPU backward:
# its cases run in the slow tier and compare forward values only.
FLEX = pytest.param("flex_attention", marks=pytest.mark.slow)
BACKENDS = ["sdpa", "eager", FLEX]


def random_samples(lengths: list[int]) -> list[dict[str, Tensor]]:
    return [{"input_ids": ids, "labels": labels} for ids, labels in seeded_samples(lengths)]


def logits_of(module: CausalLMModule, inputs: dict, *, right_padded: bool = False) -> Tensor:
    """Logits of every position, through the module's own attention path."""
    kwargs = body_inputs(inputs, module.architecture.attn_implementation, right_padded=right_padded)
    hidden = module.model.get_decoder()(**kwargs, use_cache=False).last_hidden_state
    return module.model.get_output_embeddings()(hidden)


def token_losses(module: CausalLMModule, inputs: dict, *, right_padded: bool = False) -> Tensor:
    """Cross-entropy of each supervised token, in sample order."""
    logits = logits_of(module, inputs, right_padded=right_padded)[:, :-1]
    targets = inputs["labels"][:, 1:]
    keep = targets != IGNORE_INDEX
    return F.cross_entropy(logits[keep], targets[keep], reduction="none")


@pytest.mark.parametrize("attn_implementation", BACKENDS)
def test_packed_equals_padded_losses_and_gradients(attn_implementation: str) -> None:
    """float64 (flex attention: float32, all its CPU kernel takes): a packed row
    (transformers' mask from position_ids) computes what the same samples compute as
    separate padded rows, with the padded rows' mask or without it."""
    flex = attn_implementation == "flex_attention"
    module = tiny_module(
        loss_chunk_tokens=6,
        attn_implementation=attn_implementation,
        model_dtype="float32" if flex else "float64",
    )
    samples = random_samples(LENGTHS)
    padded = pad_collate(samples, pad_id=0)
    packed = pack_collate(samples, pad_to_multiple_of=8)
    with torch.no_grad():
        masked = token_losses(module, padded)
        unmasked = token_losses(module, padded, right_padded=True)
        packed_tokens = token_losses(module, packed)
    assert masked.numel() == packed_tokens.numel() == 25
    # eager takes its softmax in float32 whatever the model's dtype: float32 rounding there.
    tolerance = 1e-5 if flex else 1e-6 if attn_implementation == "eager" else 1e-10
    assert rel_err(unmasked, masked) <= tolerance  # right padding: the mask changes nothing
    assert rel_err(packed_tokens, masked) <= tolerance
    if flex:
        return  # no flex backward on CPU
    padded_sum, padded_count = module(padded)
    packed_sum, packed_count = module(packed)
    assert packed_count == padded_count == 25
    assert abs(float(packed_sum.detach() / padded_sum.detach()) - 1) <= tolerance
    assert rel_err(grads_of(module, packed_sum), grads_of(module, padded_sum)) <= tolerance


def logit_shifts(
    module: CausalLMModule, inputs: dict, bounds: list[int], target: int, *, raw: bool = False
) -> list[float]:
    """Per sample (``bounds`` = its boundaries in the row), the largest change of its
    logits when the tokens of sample ``target`` change (``raw``: ``inputs`` go to the
    decoder as they are, not through ``body_inputs``)."""
    changed = dict(inputs)
    changed["input_ids"] = inputs["input_ids"].clone()
    start, stop = bounds[target], bounds[target + 1]
    changed["input_ids"][0, start:stop] = (changed["input_ids"][0, start:stop] + 1) % VOCAB

    def logits(batch: dict) -> Tensor:
        if not raw:
            return logits_of(module, batch)
        hidden = module.model.get_decoder()(**batch, use_cache=False).last_hidden_state
        return module.model.get_output_embeddings()(hidden)

    with torch.no_grad():
        delta = (logits(changed) - logits(inputs)).abs()[0]
    return [float(delta[a:b].max()) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


@pytest.mark.parametrize("attn_implementation", BACKENDS)
def test_packed_samples_do_not_attend_to_each_other(attn_implementation: str) -> None:
    flex = attn_implementation == "flex_attention"
    module = tiny_module(
        loss_chunk_tokens=6,
        attn_implementation=attn_implementation,
        model_dtype="float32" if flex else "float64",
    )
    packed = pack_collate(random_samples(LENGTHS))
    bounds = packed["cu_seqlens"].tolist()
    shifts = logit_shifts(module, packed, bounds, target=1)
    assert shifts[1] > 1e-3  # its own logits change
    assert all(shifts[k] <= (1e-6 if flex else 1e-10) for k in (0, 2, 3))  # nobody else's


def test_an_all_ones_mask_on_a_packed_row_is_refused() -> None:
    """The trap: with any attention_mask transformers ignores the boundaries in
    position_ids, so an all-ones mask beside packed positions lets samples attend to each
    other. body_inputs refuses it; the control shows the leak it would cause."""
    module = tiny_module(loss_chunk_tokens=6)
    packed = pack_collate(random_samples(LENGTHS))
    ones = torch.ones_like(packed["input_ids"])
    with pytest.raises(ValueError, match="must not carry an attention_mask"):
        body_inputs(packed | {"attention_mask": ones}, "sdpa")
    with pytest.raises(ValueError, match="must not carry an attention_mask"):
        module(packed | {"attention_mask": ones})
    bounds = packed["cu_seqlens"].tolist()
    leaky = {key: packed[key] for key in ("input_ids", "position_ids")} | {"attention_mask": ones}
    shifts = logit_shifts(module, leaky, bounds, target=1, raw=True)
    assert shifts[0] <= 1e-10  # causality alone protects the sample before it
    assert shifts[2] > 1e-3 and shifts[3] > 1e-3  # the samples after it see it


def test_sdpa_attention_gets_the_block_mask_built_from_positions() -> None:
    module = tiny_module(loss_chunk_tokens=6)
    packed = pack_collate(random_samples(LENGTHS))
    seen: list[Tensor] = []
    for layer in module.model.get_decoder().layers:
        layer.self_attn.register_forward_pre_hook(
            lambda _m, _args, kwargs: seen.append(kwargs["attention_mask"]), with_kwargs=True
        )
    module(packed)
    bounds = packed["cu_seqlens"].tolist()
    sample_of = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))
    expected = (sample_of[:, None] == sample_of[None, :]).tril()
    assert len(seen) == 2 and bounds[-1] == sum(LENGTHS)
    assert all(mask.shape[-2:] == expected.shape for mask in seen)
    assert all(torch.equal(mask.reshape(expected.shape), expected) for mask in seen)


def test_padded_odb_batches_reach_attention_without_a_mask() -> None:
    module = tiny_module(loss_chunk_tokens=6)
    padded = pad_collate(random_samples(LENGTHS), pad_id=0)
    seen: list[object] = []
    module.model.get_decoder().layers[0].self_attn.register_forward_pre_hook(
        lambda _m, _args, kwargs: seen.append(kwargs.get("attention_mask")), with_kwargs=True
    )
    meta = odb_meta(padded)
    module(padded, meta)
    module(padded)  # a plain dict: a user's batch keeps its mask
    assert seen[0] is None and isinstance(seen[1], Tensor)


def odb_meta(inputs: dict) -> StepMeta:
    return StepMeta(
        sample_ids=tuple(range(inputs["input_ids"].shape[0])),
        is_idle=False,
        local_samples=inputs["input_ids"].shape[0],
        local_real_tokens=0,
        local_padded_tokens=inputs["input_ids"].numel(),
        local_loss_tokens=loss_tokens(inputs),
        global_samples=inputs["input_ids"].shape[0],
        global_loss_tokens=None,
        round_index=0,
        step=0,
        epoch=0,
    )


def test_metadata_count_gathers_the_same_rows_without_a_sync_and_is_checked() -> None:
    module = tiny_module(loss_chunk_tokens=6)
    padded = pad_collate(random_samples(LENGTHS), pad_id=0)
    meta = odb_meta(padded)
    by_mask, count = module(padded)
    by_count, known = module(padded, meta)
    assert count == known == 25
    assert torch.allclose(by_mask, by_count, rtol=1e-6)
    module.check_loss_token_counts()  # consistent: nothing to report
    module(padded, meta._replace(local_loss_tokens=24))
    with pytest.raises(ValueError, match="differs from their step metadata"):
        module.check_loss_token_counts()


@pytest.mark.parametrize(
    "backend", ["flash_attention_2", "flash_attention_3", "kernels-community/flash-attn3"]
)
def test_flash_backends_get_varlen_kwargs_and_no_mask(backend: str) -> None:
    packed = pack_collate(SAMPLES)
    kwargs = body_inputs(packed, backend)
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
    for other in ("sdpa", "eager", "flex_attention"):
        plain = body_inputs(packed, other)
        assert set(plain) == {"input_ids", "position_ids"}


# -- the data module -----------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["odb_packed", "odb"])
def test_data_module_collates_by_mode(mode: str) -> None:
    batching = BatchingConfig.of(mode=mode, token_budget=2048, outstanding_depth=16, num_workers=0)
    data = ODBDataModule.of(
        QwenTokenizer(),
        batching,
        name="synthetic",
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
    if mode == "odb_packed":
        assert inputs["input_ids"].shape == (1, sum(lengths))
        assert inputs["position_ids"].shape == (1, sum(lengths))
        assert inputs["cu_seqlens"].tolist()[-1] == sum(lengths)
        assert "attention_mask" not in inputs
        assert meta.local_padded_tokens == meta.local_real_tokens == sum(lengths)
    else:
        assert inputs["input_ids"].shape == (len(lengths), max(lengths))
        assert "position_ids" not in inputs and "attention_mask" in inputs
    assert loss_tokens(inputs) == meta.local_loss_tokens
