"""The Qwen2-VL module: M-RoPE positions as the model's own, packed rows equal padded
ones, samples of a packed row independent, the vision tower on every step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers.vlm import model_sample, tiny_vlm, tiny_vlm_arguments
from odb_lightning.core.rows import PaddedRows
from odb_lightning.lit.model.vlm_module import VisionLanguageModule, fold_vlm_ids
from odb_lightning.runtime.batch import build_step_meta, idle_samples, pack_collate, pad_collate

# (image sizes, prompt tokens, answer tokens, seed): two images, one, none, one.
SPECS = [
    ([(90, 60), (40, 120)], 5, 7, 1),
    ([(112, 112)], 3, 9, 2),
    ([], 6, 8, 3),
    ([(70, 50)], 2, 4, 4),
]


@pytest.fixture(scope="module")
def module() -> VisionLanguageModule:
    return tiny_vlm()


@pytest.fixture(scope="module")
def samples() -> list[dict[str, torch.Tensor]]:
    return [model_sample(*spec) for spec in SPECS]


def token_losses(module: VisionLanguageModule, batch: dict) -> torch.Tensor:
    """Per-token cross-entropy of the supervised targets, in row-major order, from the
    full logits of the module's multimodal body."""
    kwargs = {k: v for k, v in batch.items() if k not in ("labels", "cu_seqlens", "max_seqlen")}
    if "cu_seqlens" in batch:
        kwargs.pop("attention_mask", None)
    if "pixel_values" in kwargs and kwargs["pixel_values"].numel() == 0:
        del kwargs["pixel_values"], kwargs["image_grid_thw"]
    hidden = module.multimodal_body()(**kwargs, use_cache=False).last_hidden_state
    logits = module.model.get_output_embeddings()(hidden)
    targets = batch["labels"][:, 1:]
    keep = targets != -100
    return F.cross_entropy(logits[:, :-1][keep], targets[keep], reduction="none")


def test_positions_are_the_models_own_rope_index(module, samples) -> None:
    batch = pad_collate(samples)
    body = module.multimodal_body()
    image_tokens = (batch["input_ids"] == 997).int()
    expected, _ = body.get_rope_index(
        batch["input_ids"],
        image_tokens,
        batch["image_grid_thw"],
        attention_mask=batch["attention_mask"],
    )
    real = batch["attention_mask"].bool()
    assert torch.equal(batch["position_ids"][1:][:, real], expected[:, real])
    assert torch.equal(
        batch["position_ids"][0][real],
        torch.cat([torch.arange(s["input_ids"].numel()) for s in samples]),
    )
    # The spatial rows differ from the text positions inside an image.
    assert not torch.equal(batch["position_ids"][2], batch["position_ids"][0])


def test_packed_rows_give_the_padded_per_token_losses(module, samples) -> None:
    padded, packed = pad_collate(samples), pack_collate(samples)
    assert packed["input_ids"].shape[0] == 1
    assert torch.equal(packed["pixel_values"], padded["pixel_values"])
    with torch.no_grad():
        expected, actual = token_losses(module, padded), token_losses(module, packed)
    # Packing masks each sample's first label (its first token is never a target in a row
    # of its own either), so both score the same targets, in the same order.
    assert actual.shape == expected.shape and actual.numel() == sum(
        int((s["labels"][1:] != -100).sum()) for s in samples
    )
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)
    with torch.no_grad():
        loss_padded, n_padded = module(padded)
        loss_packed, n_packed = module(packed)
    assert n_padded == n_packed == actual.numel()
    assert float(loss_packed) == pytest.approx(float(expected.sum()), rel=1e-10)
    assert float(loss_padded) == pytest.approx(float(expected.sum()), rel=1e-10)
    # A runtime batch (with its metadata) runs without the attention mask: same loss.
    meta = build_step_meta(
        range(len(samples)),
        [s["input_ids"].numel() for s in samples],
        n_padded,
        rows=PaddedRows(),
        global_samples=len(samples),
        global_loss_tokens=n_padded,
        round_index=0,
        step=0,
        epoch=0,
    )
    with torch.no_grad():
        loss_unmasked, _ = module(padded, meta)
    assert float(loss_unmasked) == pytest.approx(float(expected.sum()), rel=1e-10)


def test_an_image_changes_only_its_own_samples_logits(module, samples) -> None:
    changed = [dict(s) for s in samples]
    changed[1]["pixel_values"] = samples[1]["pixel_values"] + 0.5  # sample 1's only image

    def logits(batch_samples):
        batch = pack_collate(batch_samples)
        kwargs = {k: v for k, v in batch.items() if k not in ("labels", "cu_seqlens", "max_seqlen")}
        with torch.no_grad():
            hidden = module.multimodal_body()(**kwargs, use_cache=False).last_hidden_state
            return module.model.get_output_embeddings()(hidden)[0], batch["cu_seqlens"]

    before, bounds = logits(samples)
    after, _ = logits(changed)
    for k in range(len(samples)):
        rows = slice(int(bounds[k]), int(bounds[k + 1]))
        difference = float((after[rows] - before[rows]).abs().max())
        if k == 1:
            assert difference > 1e-6  # its own logits do change
        else:
            assert difference == 0.0, f"sample {k} changed by {difference}"


@pytest.mark.parametrize("kind", ["text_only", "idle"])
def test_batches_without_images_run_the_vision_tower(module, kind) -> None:
    text = model_sample([], 4, 6, seed=7)
    batch = pad_collate([text]) if kind == "text_only" else pad_collate(idle_samples(0))
    visual = module.multimodal_body().visual
    module.zero_grad(set_to_none=True)
    loss, count = module(batch)
    loss.backward()
    grads = [p.grad for p in visual.parameters()]
    assert all(g is not None for g in grads)  # every vision parameter took part
    assert all(float(g.abs().max()) == 0.0 for g in grads)  # with zero weight
    # The dummy term adds nothing to the loss.
    module.zero_grad(set_to_none=True)
    with torch.no_grad():
        reference = token_losses(module, batch).sum() if count else torch.zeros(())
    assert float(loss.detach()) == pytest.approx(float(reference), abs=1e-12)


def test_folded_ids_keep_the_vision_ids_apart() -> None:
    ids = torch.tensor([[5, 151655, 151652, 151653, 200_000, 4093]])
    labels = torch.tensor([[-100, -100, -100, -100, 200_000, 4093]])
    folded = fold_vlm_ids({"input_ids": ids, "labels": labels}, 4096, (151655, 151652, 151653))
    assert folded["input_ids"].tolist() == [[5, 4095, 4094, 4093, 200_000 % 4093, 0]]
    assert folded["labels"].tolist() == [[-100, -100, -100, -100, 200_000 % 4093, 0]]


def test_a_local_pretrained_vlm_loads_its_weights(tmp_path: Path, module, samples) -> None:
    module.model.save_pretrained(tmp_path / "vlm")
    arguments = tiny_vlm_arguments(pretrained_path=str(tmp_path / "vlm"), model_dtype="float64")
    loaded = VisionLanguageModule(**arguments)
    loaded.configure_model()
    assert type(loaded.model) is type(module.model)
    original = module.model.state_dict()
    for name, tensor in loaded.model.state_dict().items():
        assert torch.equal(tensor, original[name]), name
    batch = pad_collate(samples[:2])
    with torch.no_grad():
        assert float(loaded(batch)[0]) == float(module(batch)[0])


def test_the_family_refuses_another_language_model_and_reads_head_dim() -> None:
    with pytest.raises(ValueError, match="model_type=llama: the Qwen2-VL family"):
        VisionLanguageModule(**tiny_vlm_arguments(model_type="llama"))
    # Heads of 16 (not hidden_size / heads = 8): the rotary sections must sum to 8.
    with pytest.raises(ValueError, match="must sum to head_dim / 2 = 8"):
        VisionLanguageModule(**tiny_vlm_arguments(head_dim=16, vision_mrope_section=[2, 1, 1]))
