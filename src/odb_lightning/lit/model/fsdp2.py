"""FSDP2 with every rank data-parallel: Lightning's ``ModelParallelStrategy`` with the
data-parallel size taken from the job (``devices x num_nodes``) and no tensor parallelism.

``ModelParallelStrategy`` defaults to one data-parallel group per node and tensor
parallelism across a node's devices; ODB gives every rank its own batches, so each rank
is its own data-parallel replica. The module shards itself in ``configure_model``
(:mod:`odb_lightning.lit.model.setup`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry
from typing_extensions import override


class FSDP2Strategy(ModelParallelStrategy):
    """``ModelParallelStrategy(data_parallel_size=<world size>, tensor_parallel_size=1)``.

    Args:
        save_distributed_checkpoint: Each rank saves its shards (a checkpoint directory);
            ``False`` gathers a single file on rank 0.
        process_group_backend: ``nccl`` on GPUs, ``gloo`` on CPU (default: the device's).
        timeout: Of the default process group's collectives.
    """

    strategy_name = "fsdp2"

    def __init__(
        self,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )

    @override
    def setup_environment(self) -> None:
        # Known only now: Lightning sets num_nodes and the devices after construction.
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="FSDP2 with every rank data-parallel"
        )


FSDP2Strategy.register_strategies(StrategyRegistry)
