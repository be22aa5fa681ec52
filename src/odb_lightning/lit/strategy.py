"""``ODBStrategy`` (``strategy="odb_ddp"``): DDP plus the ODB metadata rendezvous and
zero-weight IDLE steps.

Lightning has no DDP ``Join``, so a rank whose shard is exhausted must still take part in
every gradient all-reduce. The ODB loader gives it IDLE batches (a one-token dummy); this
strategy runs them through the model like any step and multiplies their loss by 0, so
the all-reduce stays aligned and the IDLE step adds nothing to the gradient, whatever the
LightningModule returns.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from typing_extensions import override

from odb_lightning.lit.idle_steps import zero_weight
from odb_lightning.runtime.batch import ODBBatch
from odb_lightning.runtime.rendezvous import MetadataStore, Rendezvous, host_rendezvous


class ODBStrategy(DDPStrategy):
    """DDP that owns the ODB metadata rendezvous and neutralizes IDLE steps.

    After the default process group is up, rank 0 hosts a dedicated ``TCPStore`` whose
    address every rank learns once; each ODB loader builds its own Gloo channel on it
    (:meth:`metadata_rendezvous`), so the training group never carries the metadata.
    """

    strategy_name = "odb_ddp"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rendezvous: Rendezvous | None = None
        self._store: MetadataStore | None = None

    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        self._rendezvous, self._store = host_rendezvous(self.world_size, self.global_rank)

    @property
    def metadata_store(self) -> MetadataStore | None:
        """This rank's handle on the metadata store (after ``setup_environment``)."""
        return self._store

    def metadata_rendezvous(self, name: str) -> Rendezvous:
        """The rendezvous for the loader called ``name`` (unique per loader in a job).

        Every rank builds its loaders in the same order with the same names, so the
        derived key prefix agrees across ranks without another collective.
        """
        if self._rendezvous is None:
            raise RuntimeError("the ODB rendezvous exists only after setup_environment()")
        base = self._rendezvous
        return Rendezvous(base.host, base.port, base.rank, base.world_size, f"{base.prefix}-{name}")

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        output = super().training_step(*args, **kwargs)
        batch = args[0] if args else kwargs.get("batch")
        if isinstance(batch, ODBBatch) and batch.meta.is_idle:
            return zero_weight(output)
        return output

    @override
    def teardown(self) -> None:
        super().teardown()
        self._store = None
        self._rendezvous = None

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            cls.strategy_name,
            cls,
            description="DDP with the ODB metadata rendezvous and zero-weight IDLE steps",
        )


ODBStrategy.register_strategies(StrategyRegistry)
