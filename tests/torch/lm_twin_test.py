"""`kolo train --model lm` against its PyTorch twin (bench/peers/torch_lm.py), end to end: the
twin's initial weights written as safetensors under kolo's names start `kolo train --init`,
both train AdamW on the same file-order batches (--no-shuffle), and the loss of every step
agrees to float rounding, on one device and on two ranks (multi-worker-mirrored, fsdp and a
two-stage pipeline); then the same for `--arch llama --kv-heads 2` against its twin
(bench/peers/torch_llama.py: RMSNorm, rotary grouped-query attention, SwiGLU, tied embeddings),
on one device, under fsdp, on two pipeline stages that hold copies of the tied table, and on
two tensor-parallel ranks that split the tied table by vocabulary. Needs
python3-torch (exit 77 without it) and the kolo binary (argv[1])."""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError:
    print("python3-torch is not installed: skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "peers"))
from torch_llama import make_llama  # noqa: E402
from torch_lm import DEFAULT_TEXT, file_order_batch, lm_loss, make_lm, training_bytes  # noqa: E402

LAYERS, D_MODEL, HEADS, SEQ_LEN, BATCH, STEPS = 2, 32, 4, 16, 8, 6
KV_HEADS = 2  # --arch llama
LR, WEIGHT_DECAY = 1e-2, 0.1
TOLERANCE = 1e-5  # relative, per step's loss


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def torch_losses(init_path, arch):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if arch == "llama":
        model = make_llama(LAYERS, D_MODEL, HEADS, KV_HEADS, SEQ_LEN)
        # The state dict names the tied table twice, as kolo's does.
        write_safetensors(init_path, {n: p.detach().numpy() for n, p in model.state_dict().items()})
    else:
        model = make_lm(LAYERS, D_MODEL, HEADS, SEQ_LEN)
        write_safetensors(init_path, {n: p.detach().numpy() for n, p in model.named_parameters()})
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    part = training_bytes(DEFAULT_TEXT)
    losses = []
    for step in range(STEPS):
        x, y = file_order_batch(part, step, BATCH, SEQ_LEN)
        opt.zero_grad()
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def kolo_losses(kolo, launch, flags, init_path, metrics_path):
    command = launch + [kolo, "train", "--model", "lm", "--data", DEFAULT_TEXT, "--layers", str(LAYERS),
                        "--d-model", str(D_MODEL), "--heads", str(HEADS), "--seq-len", str(SEQ_LEN),
                        "--batch", str(BATCH), "--steps", str(STEPS), "--no-shuffle", "--optimizer", "adamw",
                        "--lr", str(LR), "--weight-decay", str(WEIGHT_DECAY), "--schedule", "constant",
                        "--init", init_path, "--metrics", metrics_path] + flags
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        sys.exit(f"{' '.join(command)} exited with {run.returncode}:\n{run.stderr[-2000:]}")
    with open(metrics_path) as f:
        lines = [json.loads(line) for line in f]
    return [line["train_loss"] for line in lines if line.get("kind") == "interval"]


def compare(kolo, arch, runs):
    """Prints each run's losses against the twin's; True when one is beyond TOLERANCE."""
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        init_path = os.path.join(tmp, "init.safetensors")
        expected = torch_losses(init_path, arch)
        for i, (name, (launch, flags)) in enumerate(runs.items()):
            got = kolo_losses(kolo, launch, flags, init_path, os.path.join(tmp, f"metrics{i}.jsonl"))
            worst = max(abs(a - b) / abs(b) for a, b in zip(got, expected)) if len(got) == STEPS else float("inf")
            print(f"{name}: kolo {['%.6f' % v for v in got]}, PyTorch {['%.6f' % v for v in expected]}, "
                  f"largest relative difference {worst:.2g}")
            failed = failed or not worst <= TOLERANCE
    return failed


def main():
    kolo = sys.argv[1]
    pair = [kolo, "run", "-n", "2", "--"]
    llama = ["--arch", "llama", "--kv-heads", str(KV_HEADS)]
    cases = [
        ("gpt", {
            "one device": ([], []),
            "multi-worker-mirrored, 2 ranks": (pair, ["--strategy", "multi-worker-mirrored"]),
            "fsdp, 2 ranks": (pair, ["--strategy", "fsdp"]),
            "pipeline, 2 stages": (pair, ["--strategy", "pipeline", "--stages", "2", "--micro-batches", "2"]),
        }),
        ("llama", {
            "llama, one device": ([], llama),
            "llama, fsdp, 2 ranks": (pair, llama + ["--strategy", "fsdp"]),
            "llama, pipeline, 2 stages": (pair, llama + ["--strategy", "pipeline", "--stages", "2",
                                                         "--micro-batches", "2", "--split-at", "2"]),
            "llama, tensor, 2 ranks": (pair, llama + ["--strategy", "tensor", "--tp", "2"]),
        }),
    ]
    failed = False
    for arch, runs in cases:
        failed = compare(kolo, arch, runs) or failed
    if failed:
        sys.exit(f"a run's losses are more than {TOLERANCE} away from PyTorch's")

if __name__ == "__main__":
    main()
