"""The job's store, bound to ``MASTER_ADDR`` instead of every interface.

The default process group's ``TCPStore`` (on ``MASTER_PORT``, hosted by global rank 0) is
also where the ODB metadata channel meets. torch's server listens on all interfaces and
has no authentication (``docs/reliability.md``, "The job store"). Where the trainer's
rank 0 builds that store itself, i.e. Lightning's own launcher or one process per rank
started by SLURM, :func:`bind_job_store` hosts it first, listening on the numeric
address of ``MASTER_ADDR`` only (:func:`~odb_lightning.runtime.rendezvous.host_job_store`);
torch's store then reuses that server. Under torchrun the agent hosts the store
(``TORCHELASTIC_USE_AGENT_STORE``) and binds it itself; with a spawning launcher
(``start_method="spawn"``/``"fork"``) rank 0 is another process. Both are left as they are,
as is a default group that already exists when the fit starts (the later jobs of a Hydra
multirun, whose processes keep the first job's group and its store).
"""

from __future__ import annotations

import ipaddress
import logging
import os

import lightning.pytorch as pl
import torch.distributed as dist
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher

from odb_lightning.runtime.rendezvous import host_job_store, numeric_address

log = logging.getLogger(__name__)


def bind_job_store(trainer: pl.Trainer) -> dist.TCPStore | None:
    """Host the job's store on ``MASTER_ADDR`` in this process when it is the store's host
    (see the module docstring); keep the result alive until the fit returns.

    Raises:
        MetadataChannelError: ``MASTER_ADDR:MASTER_PORT`` cannot be bound on this node.
    """
    strategy = trainer.strategy
    if not isinstance(strategy, ParallelStrategy) or trainer.world_size == 1:
        return None
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return None  # torchrun's agent hosts it
    if dist.is_available() and dist.is_initialized():
        # A later job of a multirun in this process: the default group of the first job,
        # which Lightning reuses, still holds the server this function bound then.
        return None
    if isinstance(strategy.launcher, _MultiProcessingLauncher):
        return None  # rank 0 is a spawned process, which builds its own
    environment = strategy.cluster_environment
    if environment is None or environment.global_rank() != 0 or trainer.global_rank != 0:
        return None
    port = environment.main_port  # chosen once: the launcher gives the same to every rank
    host = numeric_address(environment.main_address, port)
    if trainer.num_nodes > 1 and ipaddress.ip_address(host).is_loopback:
        # A node's own name often resolves to 127.0.1.1 on that node and to its network
        # address on the others: bound to the loopback, the other nodes could not connect.
        log.warning(
            "MASTER_ADDR %s resolves to the loopback address %s on rank 0 of a %d-node job: "
            "the job's store listens on every interface (set MASTER_ADDR to the node's "
            "network address to bind it there)",
            environment.main_address, host, trainer.num_nodes,
        )  # fmt: skip
        return None
    server = host_job_store(host, port)
    log.info("the job's store listens on %s:%d only (MASTER_ADDR)", host, port)
    return server
