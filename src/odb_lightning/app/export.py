"""``odb-export``: a training checkpoint as a Hugging Face ``save_pretrained`` directory.

Rebuilds the :class:`~odb_lightning.lit.model.module.CausalLMModule` from the checkpoint's
hyperparameters, loads its weights and writes them for ``transformers``/``peft``:

- a full fine-tune: the whole model (``AutoModelForCausalLM.from_pretrained(DIR)``);
- a LoRA fine-tune: the adapter only (``adapter_config.json`` and the adapter weights,
  ``PeftModel.from_pretrained(base, DIR)``), or with ``--merge`` the base with the
  adapters merged into its weights (a plain model again).

A checkpoint is a Lightning ``.ckpt`` file (one process, DDP) or, under FSDP2 with
``save_distributed_checkpoint``, a directory of shards (``.metadata``, ``*.distcp`` and
Lightning's ``meta.pt``); both are read in this one process, on CPU. ``token_id_fold``
checkpoints are refused: they are benchmark stand-ins whose vocabulary is the fold, not
the tokenizer's, so no Hugging Face model reproduces what they were trained on (the fold
in effect is read from the checkpoint's architecture: a pretrained model has none, so a
``debug=smoke model=pretrained`` checkpoint exports). The run's tokenizer (its config's
``tokenizer`` node, saved in the checkpoint) is written beside the model, so the
directory loads with ``AutoTokenizer.from_pretrained(DIR)`` too.

Usage::

    odb-export outputs/train/<run>/checkpoints/last.ckpt --out exported/adapter
    odb-export outputs/train/<run>/checkpoints/last.ckpt --out exported/merged --merge
    python -m odb_lightning.app.export <checkpoint> --out <dir>

A LoRA adapter loads onto the base it was trained on (``pretrained_path``, recorded as
``base_model_name_or_path`` in ``adapter_config.json``); a random-init base exists only
in the checkpoint, so export such a run with ``--merge``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from odb_lightning.app.checkpoints import (
    DISTRIBUTED_METADATA_FILENAME,
    NotACheckpointError,
    load_sharded_weights,
    read_checkpoint_file,
)
from odb_lightning.app.run_config import saved_run_config
from odb_lightning.core.nodes import target_of
from odb_lightning.data import HFTokenizer, QwenTokenizer
from odb_lightning.data.hf_tokenizer import export_hf_tokenizer
from odb_lightning.lit.model.config import Architecture, FinetuningMethod
from odb_lightning.lit.model.module import CausalLMModule


class ExportError(Exception):
    """Bad input the user can fix; printed without a traceback."""


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote.

    Attributes:
        kind: ``full model``, ``merged model`` or ``LoRA adapter``.
        out_dir: The ``save_pretrained`` directory.
        files: The names written into it.
        parameters: Parameters written (the adapter's alone for an adapter).
        base_parameters: For an adapter: the parameters of the base it applies to.
        base: For an adapter: where its base comes from.
        tokenizer: The run's tokenizer written beside the model, or why there is none.
    """

    kind: str
    out_dir: Path
    files: tuple[str, ...]
    parameters: int
    base_parameters: int | None = None
    base: str | None = None
    tokenizer: str | None = None

    def describe(self) -> str:
        """The one-line summary ``odb-export`` prints."""
        line = (
            f"wrote a {self.kind} of {self.parameters:,} parameters to {self.out_dir} "
            f"({', '.join(self.files)})"
        )
        if self.base_parameters is not None:
            line += f"; its base ({self.base_parameters:,} parameters) is {self.base}"
        if self.tokenizer is not None:
            line += f"; tokenizer: {self.tokenizer}"
        return line


def read_hyperparameters(path: Path, checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The ``CausalLMModule`` arguments saved in ``checkpoint`` (read from ``path``), as the
    plain nodes the module saved (:meth:`CausalLMModule.hyperparameters`).

    Raises:
        ExportError: There are none, or they describe a ``token_id_fold`` stand-in.
    """
    hyper_parameters = checkpoint.get("hyper_parameters")
    if not isinstance(hyper_parameters, dict):
        raise ExportError(
            f"{path} has no 'hyper_parameters': not a checkpoint of a CausalLMModule run"
        )
    architecture = hyper_parameters.get("architecture")
    if not isinstance(architecture, dict):
        raise ExportError(f"{path}: its hyperparameters have no 'architecture': not a checkpoint "
                          "of a CausalLMModule run")  # fmt: skip
    # The fold in effect, by the architecture's own rule (a pretrained model has none).
    known = {name: architecture[name] for name in ("pretrained_path", "token_id_fold")}
    fold = Architecture(**{k: v for k, v in known.items() if v is not None}).fold
    if fold is not None:
        raise ExportError(
            f"{path} is a token_id_fold={fold} benchmark stand-in (token ids were taken "
            f"modulo {fold}, its vocabulary is {fold} ids, not the tokenizer's): it is not "
            "a language model, so it is not exported"
        )
    pretrained_path = architecture.get("pretrained_path")
    if pretrained_path is not None and not Path(pretrained_path).is_dir():
        raise ExportError(
            f"{path} was trained from model.architecture.pretrained_path={pretrained_path}, "
            "which rebuilding "
            "the model reads (its architecture and the base of an adapter): no such directory"
        )
    return hyper_parameters


TRUSTED_TARGETS = ("odb_lightning.", "torch.optim.")
"""What a checkpoint's hyperparameter nodes may name as ``_target_``: instantiating them
runs the named callable, so a checkpoint from elsewhere must not name any other."""


def check_targets(path: Path, node: Any, key: str = "hyper_parameters") -> None:
    """Refuse a node that names a ``_target_`` outside :data:`TRUSTED_TARGETS`.

    Raises:
        ExportError: Naming the key and the target.
    """
    if isinstance(node, Mapping):
        target = node.get("_target_")
        if target is not None and not str(target).startswith(TRUSTED_TARGETS):
            raise ExportError(
                f"{path}: {key}._target_ is {target!r}, not a class of odb_lightning or "
                "torch.optim: the checkpoint is not one this package wrote, so it is not built"
            )
        for name, value in node.items():
            check_targets(path, value, f"{key}.{name}")
    elif isinstance(node, list | tuple):
        for index, value in enumerate(node):
            check_targets(path, value, f"{key}[{index}]")


def build_module(path: Path, hyper_parameters: Mapping[str, Any]) -> CausalLMModule:
    """A ``CausalLMModule`` of ``hyper_parameters`` with its model built on CPU.

    Raises:
        ExportError: The module refuses the hyperparameters of ``path``.
    """
    import hydra
    from hydra.errors import InstantiationException

    node = {**hyper_parameters, "_target_": target_of(CausalLMModule)}
    check_targets(path, node)
    try:
        module = hydra.utils.instantiate(node, _convert_="all")
    except InstantiationException as error:
        cause = error.__cause__ or error
        raise ExportError(f"{path}: its hyperparameters build no CausalLMModule: {cause}") from None
    module.configure_model()
    return module


def load_module(path: Path) -> CausalLMModule:
    """The trained module of a checkpoint file or FSDP2 checkpoint directory, on CPU.

    Raises:
        ExportError: ``path`` is missing, unreadable, or its weights do not fit the module
            its hyperparameters describe.
    """
    if path.is_dir():
        return _load_distributed(path)
    checkpoint = read_checkpoint_file(path)
    module = build_module(path, read_hyperparameters(path, checkpoint))
    state_dict = checkpoint.get("state_dict")
    if not isinstance(state_dict, dict):
        raise ExportError(f"{path} has no 'state_dict' (model weights)")
    try:
        module.load_state_dict(state_dict)
    except RuntimeError as error:
        raise ExportError(f"{path}: its weights do not fit its model: {error}") from None
    return module


def _load_distributed(path: Path) -> CausalLMModule:
    """Read every shard of a distributed checkpoint directory into one module."""
    meta = path / DISTRIBUTED_METADATA_FILENAME
    if not (path / ".metadata").is_file() or not meta.is_file():
        raise ExportError(
            f"{path} is a directory but no distributed checkpoint (one has .metadata and "
            f"{DISTRIBUTED_METADATA_FILENAME})"
        )
    module = build_module(path, read_hyperparameters(path, read_checkpoint_file(meta)))
    load_sharded_weights(module, path)
    return module


def parameter_count(model: nn.Module, *, trainable_only: bool = False) -> int:
    """Parameters of ``model`` (tied ones once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def check_out_dir(out_dir: Path) -> None:
    """Refuse to write over something: ``out_dir`` must be new or an empty directory.

    Raises:
        ExportError: ``out_dir`` is a file or a directory that is not empty.
    """
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExportError(f"--out {out_dir} exists and is not an empty directory")


RunTokenizer = HFTokenizer | QwenTokenizer
"""The tokenizers a run names (``conf/tokenizer/``) that export as Hugging Face files."""


def load_run_tokenizer(path: Path) -> RunTokenizer | None:
    """The tokenizer of the run that wrote ``path`` (its config's ``tokenizer`` node), or
    ``None`` for a checkpoint that records no run config.

    Raises:
        ExportError: The node names another class, or the tokenizer does not load (the
            message names the key and the fix).
    """
    import hydra

    config = saved_run_config(path) or {}
    node = (config.get("resolved") or {}).get("tokenizer")
    if not isinstance(node, Mapping):
        return None
    key = "odb_run_config.resolved.tokenizer"
    check_targets(path, node, key)
    try:
        tokenizer = hydra.utils.instantiate(node)
        if isinstance(tokenizer, HFTokenizer):
            tokenizer.backend  # noqa: B018 - loads it (lazy): a moved directory fails here
    except Exception as error:  # noqa: BLE001 - a missing or moved tokenizer directory
        cause = error.__cause__ or error
        raise ExportError(
            f"{path}: the run's tokenizer ({key}: {dict(node)}) does not load: {cause}. "
            "Put its files back where training read them"
        ) from None
    if not isinstance(tokenizer, RunTokenizer):
        raise ExportError(f"{path}: {key} is a {type(tokenizer).__name__}, which has no "
                          "Hugging Face files to export")  # fmt: skip
    return tokenizer


def save_tokenizer(tokenizer: RunTokenizer | None, out_dir: Path) -> str:
    """Write ``tokenizer`` into ``out_dir`` for ``AutoTokenizer.from_pretrained(out_dir)``;
    say what was written (or why nothing was)."""
    if tokenizer is None:
        return "none: the checkpoint records no run config, so no tokenizer was written"
    if isinstance(tokenizer, HFTokenizer):
        tokenizer.backend.save_pretrained(out_dir)
        return f"the run's {tokenizer.name_or_path}"
    export_hf_tokenizer(out_dir, tokenizer.vocab_file)
    return "the run's Qwen2 BPE"


def export_module(
    module: CausalLMModule,
    out_dir: Path,
    *,
    merge: bool,
    tokenizer: RunTokenizer | None = None,
) -> ExportResult:
    """Write ``module``'s model as a ``save_pretrained`` directory (see the module
    docstring for what each fine-tune writes).

    Merging folds the adapters into ``module``'s base model in place.

    Raises:
        ExportError: ``out_dir`` is a file or a directory that is not empty.
    """
    check_out_dir(out_dir)
    model = module.model
    if model is None:
        raise ExportError("the module's model is not built")
    base_parameters = base = None
    if module.finetuning.method is FinetuningMethod.FULL:
        kind = "full model"
    elif merge:
        kind, model = "merged model", model.merge_and_unload()
    else:
        kind = "LoRA adapter"
        base_parameters = parameter_count(model) - parameter_count(model, trainable_only=True)
        pretrained_path = module.architecture.pretrained_path
        base = pretrained_path or (
            "a random init that only the checkpoint holds: --merge writes a standalone model"
        )
    model.save_pretrained(out_dir)
    written_tokenizer = save_tokenizer(tokenizer, out_dir)
    parameters = parameter_count(model, trainable_only=kind == "LoRA adapter")
    files = tuple(sorted(p.name for p in out_dir.iterdir()))
    return ExportResult(kind, out_dir, files, parameters, base_parameters, base, written_tokenizer)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="odb-export",
        description="Write a training checkpoint as a Hugging Face save_pretrained directory.",
    )
    parser.add_argument(
        "checkpoint",
        type=Path,
        help="a Lightning .ckpt file, or an FSDP2 checkpoint directory (*.ckpt/)",
    )
    parser.add_argument("--out", type=Path, required=True, help="directory to write (new or empty)")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="LoRA: merge the adapters into the base and write the full model "
        "(default: the adapter only); a full fine-tune is written in full either way",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``odb-export``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        check_out_dir(args.out)  # before the (long) load
        module = load_module(args.checkpoint)
        tokenizer = load_run_tokenizer(args.checkpoint)
        result = export_module(module, args.out, merge=args.merge, tokenizer=tokenizer)
    except (ExportError, NotACheckpointError) as error:
        print(f"odb-export: error: {error}", file=sys.stderr)
        return 2
    print(f"odb-export: {result.describe()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
