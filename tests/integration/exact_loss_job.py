"""The one 2-rank job behind every exact-loss test that needs real ranks.

Started under torchrun (2 gloo ranks) once per session by the ``exact_loss_records``
fixture (``tests/integration/conftest.py``). Each rank fits, one after the other in the
same process group, every module of ``test_exact_loss_ddp.py`` (full fine-tuning and its
control), ``test_exact_loss_vlm_ddp.py`` (an image-text model) and
``test_exact_loss_sharded.py`` (LoRA under DDP, then full fine-tuning and LoRA under
FSDP2), and writes each one's records into the output directory. One job instead of
four: two ranks importing torch, Lightning and Transformers cost more than the six tiny
fits together.
"""

from __future__ import annotations

import sys
from pathlib import Path

import test_exact_loss_ddp as ddp
import test_exact_loss_sharded as sharded
import test_exact_loss_vlm_ddp as vlm

from helpers.torchrun import leave_ranks

if __name__ == "__main__":
    out_dir = Path(sys.argv[1])
    for module_class in (ddp.RecordingModule, ddp.PerRankMeanModule):
        ddp.fit_on_both_ranks(module_class, out_dir)
    vlm.fit_on_both_ranks(out_dir)
    for launch in ("ddp", "fsdp2"):  # FSDP2 last: its fits shard modules of their own only
        for module_class, finetuning, accumulate in sharded.LAUNCHES[launch]:
            sharded.fit_on_both_ranks(launch, module_class, finetuning, accumulate, out_dir)
    leave_ranks()
