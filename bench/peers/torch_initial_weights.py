#!/usr/bin/python3
"""torch_initial_weights.py -- writes the initial weights of a peer's model as safetensors.

torch_rpc_ps.py's server and workers build their model after torch.manual_seed(0)
(fmnist_common.make_model); this writes those very weights, so that kolo can start from them
(kolo train --init FILE) and a comparison of accuracies differs only in the data order.
The names are PyTorch's (0.weight, 0.bias, ...), which are kolo's too.
Usage: /usr/bin/python3 torch_initial_weights.py --model mlp --seed 0 OUT.safetensors
"""
import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import fmnist_common as fc  # noqa: E402


def save_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        data = tensor.detach().contiguous().to(torch.float32).numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp"], default="mlp")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("out")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    save_safetensors(args.out, fc.make_model(args.model).state_dict())


if __name__ == "__main__":
    main()
