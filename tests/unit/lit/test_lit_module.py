"""CausalLMModule: chunked LM head equals the full computation, loading, folding, FLOPs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import Tensor
from torch.utils.data import DataLoader
from transformers import Qwen2Config

from helpers.tiny_lm import (
    VOCAB,
    full_loss_sum,
    grads_of,
    hand_over,
    loss_tokens,
    module_arguments,
    pad,
    quiet_trainer,
    seeded_samples,
    tiny_module,
)
from odb_lightning.lit.model.config import Architecture
from odb_lightning.lit.model.flops import flops_per_token
from odb_lightning.lit.model.lm_head import chunked_lm_loss
from odb_lightning.lit.model.lr_schedule import LRSchedule, lr_factor
from odb_lightning.lit.model.module import CausalLMModule


def padded_batch(
    lengths: list[int], prompt: int = 2, vocab: int = VOCAB, seed: int = 0
) -> dict[str, Tensor]:
    """Right-padded batch of random samples whose first ``prompt`` labels are -100."""
    return pad(seeded_samples(lengths, prompt, seed, vocab))


LENGTHS = [13, 7, 9]  # 11 + 5 + 7 = 23 supervised tokens: a prime, no chunk size divides it


@pytest.mark.parametrize("chunk_tokens", [1, 4, 5, 23, 1000])
def test_chunked_loss_and_gradients_equal_the_full_computation(chunk_tokens: int) -> None:
    module = tiny_module(loss_chunk_tokens=chunk_tokens)
    batch = padded_batch(LENGTHS)
    expected_loss = full_loss_sum(module.model, batch)
    expected_grad = grads_of(module, expected_loss)
    loss_sum, num_loss_tokens = module(batch)
    assert num_loss_tokens == loss_tokens(batch) == 23
    assert float(loss_sum) == pytest.approx(float(expected_loss), rel=1e-10)
    grad = grads_of(module, loss_sum)
    assert float((grad - expected_grad).norm() / expected_grad.norm()) <= 1e-6


def test_chunking_never_holds_more_than_one_chunk_of_logits() -> None:
    chunk_tokens = 4
    module = tiny_module()
    batch = padded_batch(LENGTHS)
    head = module.model.get_output_embeddings()
    head_rows: list[int] = []
    head.register_forward_hook(lambda _m, _i, output: head_rows.append(output.shape[0]))
    saved_logits: list[int] = []

    def pack(tensor: Tensor) -> Tensor:
        if tensor.shape and tensor.shape[-1] == VOCAB:
            saved_logits.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        hidden = module.model.get_decoder()(**{k: v for k, v in batch.items() if k != "labels"})
        loss_sum, count = chunked_lm_loss(hidden.last_hidden_state, batch["labels"], head, 4)
    loss_sum.backward()
    # Forward runs the head once per chunk; backward recomputes each chunk once (last first).
    assert head_rows == [4, 4, 4, 4, 4, 3] + [3, 4, 4, 4, 4, 4]
    # Nothing of logits shape is kept for backward beyond one chunk (here: nothing at all).
    assert max(saved_logits, default=0) <= chunk_tokens * VOCAB
    # Control: the full computation keeps [rows, vocab] tensors for backward.
    saved_logits.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        full_loss_sum(module.model, batch)
    assert max(saved_logits) >= count * VOCAB


def test_packed_row_with_position_ids_equals_the_padded_batch() -> None:
    module = tiny_module(loss_chunk_tokens=7)
    padded = padded_batch(LENGTHS)
    rows = [padded["attention_mask"][r].bool() for r in range(len(LENGTHS))]
    packed = {
        "input_ids": torch.cat([padded["input_ids"][r][m] for r, m in enumerate(rows)])[None],
        "labels": torch.cat([padded["labels"][r][m] for r, m in enumerate(rows)])[None],
        "position_ids": torch.cat([torch.arange(n) for n in LENGTHS])[None],
    }
    padded_loss, padded_count = module(padded)
    packed_loss, packed_count = module(packed)
    assert packed_count == padded_count == 23
    assert float(packed_loss) == pytest.approx(float(padded_loss), rel=1e-10)


def test_pretrained_path_loads_the_saved_weights(tmp_path: Path) -> None:
    source = tiny_module(tie_word_embeddings=False)
    source.model.save_pretrained(tmp_path)
    arguments = module_arguments(pretrained_path=str(tmp_path), model_dtype="float64")
    loaded = CausalLMModule(**arguments)
    loaded.configure_model()
    assert loaded.model.config._attn_implementation == "sdpa"
    expected = source.model.state_dict()
    for name, tensor in loaded.model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    batch = padded_batch(LENGTHS)
    assert float(loaded(batch)[0]) == float(source(batch)[0])


def test_token_id_fold_shrinks_the_vocabulary_and_folds_ids_and_labels() -> None:
    fold = 100
    module = tiny_module(vocab_size=151936, token_id_fold=fold, loss_chunk_tokens=6)
    assert module.model.get_input_embeddings().weight.shape == (fold, 32)
    assert module.model.config.vocab_size == fold
    batch = padded_batch(LENGTHS, vocab=151936)
    assert int(batch["input_ids"].max()) >= fold  # would index out of range unfolded
    folded = dict(batch)
    folded["input_ids"] = batch["input_ids"] % fold
    folded["labels"] = torch.where(batch["labels"] < 0, batch["labels"], batch["labels"] % fold)
    loss_sum, count = module(batch)
    assert count == 23
    assert float(loss_sum) == pytest.approx(float(full_loss_sum(module.model, folded)), rel=1e-10)
    assert flops_per_token(module.model.config)["head"] == 6 * fold * 32
    # A random-init knob, like the architecture: a pretrained model keeps its vocabulary
    # (so debug=smoke runs with model.architecture.pretrained_path).
    unused = module_arguments(pretrained_path="unused", token_id_fold=fold)
    assert CausalLMModule(**unused).token_id_fold is None


def test_flops_per_token_against_a_hand_count() -> None:
    config = Qwen2Config(
        vocab_size=1000,
        hidden_size=8,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=16,
    )
    # Per layer: q 8x8=64, k 8x4=32, v 32, o 64, gate/up/down 3 x 8x16=384 -> 576 weights.
    # 6 FLOPs per weight per trained token: 3 layers x 576 x 6 = 10368.
    # Attention: 3 layers x 12 x 8 (query width) x 10 keys = 2880.
    assert flops_per_token(config, context_tokens=10) == {"body": 10368 + 2880, "head": 48000}
    default = flops_per_token(Architecture().random_init())
    assert default == {"body": 6 * 2 * 36864, "head": 6 * 151936 * 64}


def test_lr_factor_warmup_cosine_and_constant() -> None:
    cosine = LRSchedule.COSINE
    assert [lr_factor(s, 4, 14, 0.1, cosine) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, 4, 14, 0.1, cosine) == 1.0
    assert lr_factor(9, 4, 14, 0.1, cosine) == pytest.approx(0.55)  # half way: mid of 1, 0.1
    assert lr_factor(14, 4, 14, 0.1, cosine) == pytest.approx(0.1)
    assert lr_factor(99, 4, 14, 0.1, cosine) == pytest.approx(0.1)
    assert lr_factor(99, 0, 0, 0.1, LRSchedule.CONSTANT) == 1.0


def test_configure_optimizers_decays_matrices_only() -> None:
    lr = 1e-3
    module = tiny_module(lr=lr, weight_decay=0.1, betas=[0.8, 0.9], decay_steps=10, warmup_steps=2)
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    matrices, vectors = optimizer.param_groups
    assert matrices["weight_decay"] == 0.1 and vectors["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in matrices["params"]) and all(
        p.ndim == 1 for p in vectors["params"]
    )
    assert optimizer.defaults["betas"] == (0.8, 0.9)
    assert scheduler.get_last_lr()[0] == pytest.approx(lr * 0.5)  # warmup step 0 of 2


def test_validation_loss_is_token_weighted_over_batches() -> None:
    module = tiny_module()
    small, large = padded_batch([4], seed=1), padded_batch([20, 17], seed=2)
    sums = [full_loss_sum(module.model, b).item() for b in (small, large)]
    counts = [loss_tokens(b) for b in (small, large)]
    trainer = quiet_trainer(accelerator="cpu", devices=1)
    loader = DataLoader([small, large], batch_size=None, collate_fn=hand_over)
    trainer.validate(module, dataloaders=loader, verbose=False)
    val_loss = float(trainer.callback_metrics["val/loss"])
    assert val_loss == pytest.approx(sum(sums) / sum(counts), rel=1e-6)
    mean_of_means = (sums[0] / counts[0] + sums[1] / counts[1]) / 2
    assert not math.isclose(val_loss, mean_of_means, rel_tol=1e-4)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"loss_chunk_tokens": 0}, "loss_chunk_tokens"),
        ({"token_id_fold": 0}, "token_id_fold"),
        ({"model_dtype": "float8"}, "float8"),
        ({"betas": [0.9]}, "betas"),
        ({"min_lr_ratio": 1.5}, "min_lr_ratio"),
    ],
)
def test_bad_arguments_raise(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny_module(**arguments)


def test_a_batch_that_is_neither_dict_nor_odb_batch_is_rejected() -> None:
    batch = padded_batch([5])
    with pytest.raises(TypeError, match="ODBBatch"):
        tiny_module().training_step([batch], 0)


class Unsized:
    """Batches without a length, as an ODB epoch: the trainer cannot count its steps."""

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


def test_the_sample_budget_cosine_reads_the_run_context() -> None:
    from helpers.tiny_lm import step_batches
    from odb_lightning.lit.run_context import RunContext, TrainSampleCount

    steps = [seeded_samples([9, 7], seed=s) for s in range(4)]  # 2 samples per step
    batches = step_batches([steps])[0]
    lrs: list[float] = []

    def fit(module: CausalLMModule) -> None:
        trainer = quiet_trainer(accelerator="cpu", devices=1, limit_val_batches=0, max_epochs=1)
        module.on_train_batch_end = lambda *_: lrs.append(module.lr_schedulers().get_last_lr()[0])
        trainer.fit(module, train_dataloaders=Unsized(batches))

    samples = TrainSampleCount()
    samples.set(8)  # the data module's setup fills it: 8 samples over 4 steps
    fit(tiny_module(lr=1e-2, min_lr_ratio=0.1, run=RunContext(train_samples=samples)))
    # After step k the schedule has seen 2 (k + 1) of the 8 planned samples.
    expected = [
        1e-2 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 2 * (k + 1) / 8))) for k in range(4)
    ]
    assert lrs == pytest.approx(expected)
    with pytest.raises(
        ValueError, match=r"set model\.scheduler\.decay_steps or trainer\.max_steps"
    ):
        fit(tiny_module(lr=1e-2))  # no run context: no sample count to follow


def test_the_vocabulary_the_loaders_check_is_the_architectures(tmp_path: Path) -> None:
    assert tiny_module().checked_vocab_size() == VOCAB
    folded = tiny_module(token_id_fold=64)
    assert folded.checked_vocab_size() is None  # any id folds in range
    assert folded.architecture.embedding_rows() == 64  # what warm-up batches draw ids from
    source = tiny_module(vocab_size=300)
    source.model.save_pretrained(tmp_path)
    pretrained = module_arguments(pretrained_path=str(tmp_path), token_id_fold=64)
    assert CausalLMModule(**pretrained).checked_vocab_size() == 300  # the checkpoint's


def test_the_modules_take_their_configuration_by_concern() -> None:
    import inspect

    from odb_lightning.lit.model import module as module_file
    from odb_lightning.lit.model.vlm_module import VisionLanguageModule

    for cls in (CausalLMModule, VisionLanguageModule):
        parameters = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        assert len(parameters) <= 10, (cls.__name__, parameters)
    # A random init is AutoConfig.for_model(model_type): no family's config class here.
    assert "Qwen2Config" not in Path(module_file.__file__).read_text()
