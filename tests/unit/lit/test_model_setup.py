"""Model setup: float32 master weights, LoRA settings, the data-parallel mesh, and the
presets for large models."""

from __future__ import annotations

import hydra
import pytest
import torch

from helpers.configs import ComposeConfig
from helpers.tiny_lm import module_arguments, tiny_module
from odb_lightning.lit.model.config import FinetuningMethod, LoraSettings, ModelDType
from odb_lightning.lit.model.setup import check_master_weights, data_parallel_mesh

Finetuning = FinetuningMethod


def test_bfloat16_parameters_under_bf16_mixed_are_refused() -> None:
    with pytest.raises(
        ValueError, match="model.runtime.dtype=bfloat16 with trainer.precision=bf16-mix"
    ):
        check_master_weights(ModelDType.BFLOAT16, "bf16-mixed", Finetuning.FULL)
    check_master_weights(ModelDType.FLOAT32, "bf16-mixed", Finetuning.FULL)
    check_master_weights(ModelDType.BFLOAT16, "bf16-true", Finetuning.FULL)  # a choice
    check_master_weights(ModelDType.BFLOAT16, "bf16-mixed", Finetuning.LORA)  # frozen base


def test_lora_on_a_bfloat16_base_trains_float32_adapters() -> None:
    module = tiny_module(model_dtype="bfloat16", finetuning="lora", lora={"r": 2})
    dtypes = {p.dtype for p in module.parameters() if p.requires_grad}
    frozen = {p.dtype for p in module.parameters() if not p.requires_grad}
    assert dtypes == {torch.float32} and frozen == {torch.bfloat16}


@pytest.mark.parametrize("trainer", ["gpu8", "gpu8_fsdp"])
@pytest.mark.parametrize("model", ["qwen2_0_5b", "qwen2_5_1_5b", "qwen2_5_7b"])
def test_gpu_presets_keep_float32_master_weights(
    model: str, trainer: str, compose_cfg: ComposeConfig
) -> None:
    """The combination a user gets from the presets passes the guard (the earlier 0.5B
    preset, bfloat16 parameters under bf16-mixed, would raise here)."""
    cfg = compose_cfg([f"model={model}", f"trainer={trainer}"])
    finetuning = Finetuning(cfg.model.finetuning.method)
    check_master_weights(ModelDType(cfg.model.runtime.dtype), cfg.trainer.precision, finetuning)


def test_lora_settings_are_checked_naming_the_field() -> None:
    assert LoraSettings(r=4, target_modules=["q_proj"]).target_modules == ("q_proj",)
    with pytest.raises(ValueError, match=r"model.finetuning.lora.r must be an integer >= 1"):
        LoraSettings(r=0)
    with pytest.raises(ValueError, match=r"model.finetuning.lora.dropout must be in \[0, 1\)"):
        LoraSettings(dropout=1.0)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'rank'"):
        LoraSettings(rank=8)


def test_lora_trains_only_the_adapters() -> None:
    module = tiny_module(finetuning="lora", lora={"r": 2, "target_modules": ["q_proj"]})
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n and "q_proj" in n for n in trainable)
    counts = module.parameter_counts()
    # Two layers, q_proj 32 -> 32: r * (in + out) per adapter pair.
    assert counts["trainable_parameters"] == 2 * 2 * (32 + 32)
    assert counts["total_parameters"] > counts["trainable_parameters"]


def test_plain_strategies_have_no_mesh_and_tensor_parallelism_is_refused() -> None:
    assert data_parallel_mesh(None) is None
    strategy = hydra.utils.instantiate({"_target_": "lightning.pytorch.strategies.DDPStrategy"})
    assert data_parallel_mesh(strategy) is None

    from lightning.pytorch.strategies import ModelParallelStrategy

    class FakeMesh(dict):
        pass

    class Size:
        def __init__(self, n: int) -> None:
            self.n = n

        def size(self) -> int:
            return self.n

    tensor_parallel = ModelParallelStrategy()
    tensor_parallel._device_mesh = FakeMesh(tensor_parallel=Size(2), data_parallel=Size(4))
    with pytest.raises(ValueError, match="tensor_parallel_size=1"):
        data_parallel_mesh(tensor_parallel)


def test_the_model_is_built_by_configure_model_once() -> None:
    module = tiny_module()
    model = module.model
    module.configure_model()  # Lightning may call it again (fit, then validate)
    assert module.model is model
    from odb_lightning.lit.model.module import CausalLMModule

    with pytest.raises(RuntimeError, match="configure_model"):
        CausalLMModule(**module_arguments(vocab_size=64, hidden_size=16, num_attention_heads=2))(
            {"input_ids": torch.zeros(1, 2, dtype=torch.long), "labels": torch.zeros(1, 2)}
        )


def test_gradient_checkpointing_recomputes_without_changing_the_gradient(monkeypatch) -> None:
    from transformers.models.qwen2 import modeling_qwen2

    from helpers.tiny_lm import flat_grad, make_sample, pad

    calls: list[int] = []
    mlp_forward = modeling_qwen2.Qwen2MLP.forward
    # Counted on the class: module hooks do not fire when checkpointing recomputes.
    monkeypatch.setattr(
        modeling_qwen2.Qwen2MLP, "forward", lambda self, x: calls.append(1) or mlp_forward(self, x)
    )
    batch = pad([make_sample(9, 2, 1), make_sample(6, 1, 2)])
    grads, mlp_runs = [], []
    for checkpointing in (False, True):
        module = tiny_module(gradient_checkpointing=checkpointing)
        module.train()
        calls.clear()
        loss_sum, _ = module(batch)
        loss_sum.backward()
        grads.append(flat_grad(module))
        mlp_runs.append(len(calls))
    assert mlp_runs == [2, 4]  # two layers; each recomputed once in backward
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-12, atol=1e-14)


def test_enum_arguments_name_their_key() -> None:
    from odb_lightning.lit.model.module import CausalLMModule

    with pytest.raises(
        ValueError, match=r"^model.finetuning.method must be one of full, lora, got 'lorax'"
    ):
        CausalLMModule(**module_arguments(finetuning="lorax"))
    with pytest.raises(ValueError, match=r"^model.runtime.dtype must be one of float32, bfloat16"):
        CausalLMModule(**module_arguments(model_dtype="fp8"))
