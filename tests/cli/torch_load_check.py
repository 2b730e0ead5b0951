"""Loads a safetensors file written by `kolo train --save` into the PyTorch peer model
with a minimal reader of the format (torch 1.13 has no safetensors module) and prints its
test accuracy.  Usage: /usr/bin/python3 tests/cli/torch_load_check.py FILE mlp|cnn"""
import json, os, struct, sys
import numpy as np, torch
# The repository's own PyTorch peer holds the reference models and the IDX loader.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "peers"))
from torch_ddp_fmnist import load, make_model  # noqa: E402
path, name = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
meta = header.pop("__metadata__", {})
base = 8 + n
dt = {"F32": np.float32, "I64": np.int64}
sd = {k: torch.from_numpy(np.frombuffer(raw[base + v["data_offsets"][0]: base + v["data_offsets"][1]], dtype=dt[v["dtype"]]).reshape(v["shape"]).copy()) for k, v in header.items()}
m = make_model(name)
m.load_state_dict(sd)
x, y = load(os.environ.get("FMNIST_DIR", "/usr/share/datasets/fashion-mnist"), "test")
with torch.no_grad():
    acc = (m(x).argmax(1) == y).float().mean().item()
print("metadata", meta, "keys", list(sd), "torch accuracy", round(acc, 4))
