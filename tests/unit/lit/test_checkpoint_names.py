"""Checkpoint names go back on the command line as they are printed: no ``=`` in them
(Hydra's override parser refuses a second one), and a quoted override for the older
names and for directories Hydra would split."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from helpers.configs import ComposeConfig
from odb_lightning.lit.callbacks.checkpointing import (
    AtomicLinkModelCheckpoint,
    ckpt_path_override,
    stop_checkpoint_name,
)

RUN = "/runs/2026-12-02_10-00-00/checkpoints"


def _parsed(override: str) -> str:
    """What ``ckpt_path`` Hydra reads from ``override`` after the shell split it."""
    (word,) = shlex.split(override)
    (parsed,) = OverridesParser.create().parse_overrides([word])
    return parsed.value()


def test_the_checkpoint_callback_names_files_without_an_equals_sign(tmp_path: Path) -> None:
    callback = AtomicLinkModelCheckpoint(dirpath=tmp_path)
    name = callback.format_checkpoint_name({"epoch": 0, "step": 10})
    assert Path(name).name == "epoch0-step10.ckpt"
    assert stop_checkpoint_name(1, 24) == "stop-epoch1-step24.ckpt"
    for printed in (name, f"{RUN}/stop-epoch1-step24.ckpt"):
        assert _parsed(f"ckpt_path={printed}") == printed  # pasted as printed


def test_lightnings_default_name_is_what_hydra_refuses() -> None:
    """The control: the name this replaces fails in Hydra's parser unquoted."""
    from hydra.errors import OverrideParseException

    with pytest.raises(OverrideParseException, match="mismatched input '='"):
        _parsed(f"ckpt_path={RUN}/epoch=0-step=10.ckpt")


@pytest.mark.parametrize(
    "path",
    [
        f"{RUN}/epoch0-step10.ckpt",
        f"{RUN}/epoch=0-step=10.ckpt",  # written by an older version
        f"{RUN}/stop-epoch=0-step=3.ckpt",
        "/my runs/a,b/last.ckpt",
        "/runs/it's/last.ckpt",
        '/runs/say "hi"/last.ckpt',
    ],
)
def test_the_printed_override_reads_back_as_the_path(path: str) -> None:
    override = ckpt_path_override(path)
    assert _parsed(override) == path
    if path == f"{RUN}/epoch0-step10.ckpt":
        assert override == f"ckpt_path={path}"  # the names written now: bare


def test_a_printed_override_composes_the_train_config(compose_cfg: ComposeConfig) -> None:
    path = f"{RUN}/stop-epoch=0-step=3.ckpt"
    cfg = compose_cfg(shlex.split(ckpt_path_override(path)))
    assert cfg.ckpt_path == path
    cfg = compose_cfg([f"ckpt_path={RUN}/stop-epoch0-step3.ckpt"])
    assert cfg.ckpt_path == f"{RUN}/stop-epoch0-step3.ckpt"
