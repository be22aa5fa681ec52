"""What the ODB metadata channel's Gloo device binds on this node.

``GLOO_SOCKET_IFNAME`` first, else ``NCCL_SOCKET_IFNAME``, else the interface this node
uses to reach the job store (:func:`gloo_binding`), never the address of the host name.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import torch.distributed as dist

from odb_lightning.runtime.errors import MetadataChannelError


@dataclass(frozen=True, slots=True)
class GlooBinding:
    """What the channel's Gloo device binds: named interfaces, or one local address.

    Attributes:
        interfaces: Network interfaces (``GLOO_SOCKET_IFNAME``); empty: use ``address``.
        address: Numeric local address (the route to the store).
    """

    interfaces: tuple[str, ...] = ()
    address: str = "127.0.0.1"

    def devices(self) -> list[dist.ProcessGroupGloo.Device]:
        """The Gloo devices, built in the process that runs the channel."""
        if self.interfaces:
            return [dist.ProcessGroupGloo.create_device(interface=i) for i in self.interfaces]
        return [dist.ProcessGroupGloo.create_device(hostname=self.address)]

    def describe(self) -> str:
        if self.interfaces:
            return f"interface {','.join(self.interfaces)}"
        return f"local address {self.address}"


def _interfaces() -> set[str]:
    return {name for _, name in socket.if_nameindex()}


def gloo_binding(store_host: str, environ: Mapping[str, str] | None = None) -> GlooBinding:
    """What the metadata channel's Gloo device binds on this node.

    ``GLOO_SOCKET_IFNAME`` (comma-separated interfaces) first; else ``NCCL_SOCKET_IFNAME``
    when it names interfaces (``=eth0`` exactly, ``eth`` by prefix; an exclusion list
    ``^...`` is not mapped); else the local address of the route to ``store_host``.

    Raises:
        MetadataChannelError: A named interface does not exist on this node, or the route
            is loopback in a job of several nodes (``MASTER_ADDR``, a name, maps to a
            loopback address here: the other nodes could not reach it).
    """
    env = os.environ if environ is None else environ
    present = _interfaces()
    gloo = env.get("GLOO_SOCKET_IFNAME", "").strip()
    if gloo:
        names = tuple(n.strip() for n in gloo.split(",") if n.strip())
        missing = [n for n in names if n not in present]
        if missing:
            raise MetadataChannelError(
                f"GLOO_SOCKET_IFNAME names {missing}, which this node does not have "
                f"(interfaces: {sorted(present)}): set GLOO_SOCKET_IFNAME to one of them"
            )
        return GlooBinding(interfaces=names)
    nccl = env.get("NCCL_SOCKET_IFNAME", "").strip()
    if nccl and not nccl.startswith("^"):
        chosen: list[str] = []
        for spec in (s.strip() for s in nccl.split(",") if s.strip()):
            exact = spec.startswith("=")
            name = spec.lstrip("=")
            chosen += sorted(i for i in present if (i == name if exact else i.startswith(name)))
        if chosen:
            return GlooBinding(interfaces=(chosen[0],))
        raise MetadataChannelError(
            f"NCCL_SOCKET_IFNAME={nccl!r} matches no interface of this node (interfaces: "
            f"{sorted(present)}): set GLOO_SOCKET_IFNAME to the interface that reaches "
            "MASTER_ADDR"
        )
    address = route_address(store_host)
    if address.startswith("127.") and _spans_nodes(env) and not _is_numeric(env.get("MASTER_ADDR")):
        raise MetadataChannelError(
            f"MASTER_ADDR {env.get('MASTER_ADDR')!r} resolves to the loopback address "
            f"{store_host} on this node (an /etc/hosts entry), so the metadata channel would "
            "bind loopback where the other nodes cannot reach it: set GLOO_SOCKET_IFNAME to "
            "the interface the nodes share, or MASTER_ADDR to this node's routable address"
        )
    return GlooBinding(address=address)


def _spans_nodes(env: Mapping[str, str]) -> bool:
    """Whether the job runs on several nodes (torchrun's node count, SLURM's, or more
    ranks than this node's)."""
    for name in ("GROUP_WORLD_SIZE", "SLURM_NNODES"):
        if env.get(name, "1").isdigit() and int(env.get(name, "1")) > 1:
            return True
    world, local = env.get("WORLD_SIZE", ""), env.get("LOCAL_WORLD_SIZE", "")
    return world.isdigit() and local.isdigit() and int(world) > int(local)


def _is_numeric(host: str | None) -> bool:
    """A numeric address, or ``localhost``: a loopback choice made on purpose."""
    if host == "localhost":
        return True
    try:
        ipaddress.ip_address(host or "")
    except ValueError:
        return False
    return True


def route_address(host: str) -> str:
    """The local address this node uses to reach ``host`` (a numeric address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))  # a datagram socket sends nothing: this only routes
        return str(probe.getsockname()[0])
