"""kolo's collectives as PyTorch's CPU communication backend.

``import kolo_torch`` registers the backend ``"kolo"``; then
``torch.distributed.init_process_group("kolo")`` rendezvouses through torch's store and runs
every collective over kolo's shared-memory/TCP transports. Under ``kolo run`` the launcher's
variables (KOLO_RANK, KOLO_WORLD_SIZE, KOLO_STORE, ...) are mapped onto torch's (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) unless those are already set.
"""
import datetime
import os

import torch.distributed as _dist

from . import _C
from ._C import ProcessGroupKolo

__all__ = ["ProcessGroupKolo", "BACKEND"]

BACKEND = "kolo"


def _create(store, rank, size, timeout):
    return ProcessGroupKolo(store, rank, size, timeout)


def _register():
    # Importing twice (or under another module name) must not register twice.
    if BACKEND.upper() in getattr(_dist.Backend, "_plugins", {}):
        return
    _dist.Backend.register_backend(BACKEND, _create)


def _adopt_kolo_launcher():
    """Under `kolo run`, sets torch's launcher variables from kolo's (those already set win)."""
    env = os.environ
    if "KOLO_RANK" not in env or "KOLO_WORLD_SIZE" not in env:
        return
    for torch_name, kolo_name in (("RANK", "KOLO_RANK"), ("WORLD_SIZE", "KOLO_WORLD_SIZE"),
                                  ("LOCAL_RANK", "KOLO_LOCAL_RANK"),
                                  ("LOCAL_WORLD_SIZE", "KOLO_LOCAL_SIZE")):
        if kolo_name in env:
            env.setdefault(torch_name, env[kolo_name])
    if "MASTER_ADDR" in env and "MASTER_PORT" in env:
        return
    store = env.get("KOLO_STORE", "")
    if not store:
        if env["KOLO_WORLD_SIZE"] == "1":
            env.setdefault("MASTER_ADDR", "127.0.0.1")
            env.setdefault("MASTER_PORT", "29500")
        return
    # Rank 0 draws a free port on its own address and publishes it in the launcher's store.
    generation = env.get("KOLO_RESTART_COUNT", env.get("KOLO_GENERATION", "0"))
    master = _C.agree_torch_master(store, env.get("KOLO_TOKEN", ""), int(env["KOLO_RANK"]),
                                   f"kolo_torch/master/{generation}", datetime.timedelta(seconds=300))
    host, _, port = master.rpartition(":")
    env.setdefault("MASTER_ADDR", host.strip("[]"))
    env.setdefault("MASTER_PORT", port)


_register()
_adopt_kolo_launcher()
