#!/usr/bin/env bash
# Two nodes of 8 GPUs, FSDP2 on NCCL, under torchrun (docs/multinode.md). Run it once on
# each node, from the repository root, with the same MASTER_ADDR on both:
#
#   node 0:  MASTER_ADDR=node0.cluster NODE_RANK=0 examples/torchrun_2nodes.sh [overrides...]
#   node 1:  MASTER_ADDR=node0.cluster NODE_RANK=1 examples/torchrun_2nodes.sh [overrides...]
#
# MASTER_ADDR is node 0's address (or a name every node resolves to it): node 0's torchrun
# agent hosts the job's store on MASTER_ADDR:MASTER_PORT, and everything meets there, the
# agents, the NCCL training group, the ODB metadata channel, and the run directory's name
# (rank 0's clock, read by every rank: both nodes write into one outputs/train/<time>).
#
# Which network: NCCL_SOCKET_IFNAME picks NCCL's interface (e.g. ib0 or eth0); the ODB
# metadata channel (Gloo) takes GLOO_SOCKET_IFNAME, else NCCL_SOCKET_IFNAME, else the
# interface that routes to MASTER_ADDR. Both must exist on every node: the run checks
# this, and that MASTER_ADDR resolves, before training starts and names what to set.
#
# Restarts: --max-restarts=N restarts both nodes' workers after a failure; each attempt
# gets a fresh run directory. Resume one with ckpt_path=<run dir>/checkpoints/last.ckpt.
# NPROC_PER_NODE (default 8) is the GPUs per node; trainer.devices follows it.
set -euo pipefail

: "${MASTER_ADDR:?set MASTER_ADDR to node 0 (an address or name every node resolves to it)}"
: "${NODE_RANK:?set NODE_RANK to this node: 0 on the node at MASTER_ADDR, 1 on the other}"
MASTER_PORT=${MASTER_PORT:-29500}     # node 0 listens here; open it to the other node
NPROC_PER_NODE=${NPROC_PER_NODE:-8}
# export NCCL_SOCKET_IFNAME=ib0       # site-specific: the interface between the nodes
# export GLOO_SOCKET_IFNAME=ib0       # only if the metadata channel needs another one

exec .venv/bin/python -m torch.distributed.run \
    --nnodes=2 --node-rank="$NODE_RANK" --nproc-per-node="$NPROC_PER_NODE" \
    --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" --max-restarts=0 \
    train.py trainer=gpu8_fsdp trainer.num_nodes=2 trainer.devices="$NPROC_PER_NODE" "$@"
