"""Whether the Hugging Face hub can be reached, asked before a hub name is loaded: on a
machine without it, ``datasets.load_dataset`` retries for about half a minute and logs
each try; this answers at once with the reason, which the sources put in their message."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
"""With a proxy the hub is reached through it: no direct probe is made."""
PROBE_TIMEOUT_S = 5.0
"""How long the probe waits for a connection to the hub."""


def hub_unreachable(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the hub cannot be reached (``HF_HUB_OFFLINE`` set, its host unknown or not
    answering within ``timeout_s``), or ``None`` where it can or a proxy decides."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return None
    endpoint = urlparse(constants.ENDPOINT)
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as error:
        return f"{host}:{port} is not reachable from this machine ({error})"
    return None
