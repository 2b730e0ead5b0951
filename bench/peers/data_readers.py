"""The peers of bench/data_readers.cc, on the same files, printing the same JSON lines:
pandas.read_csv (whole table), numpy.load(mmap_mode='r') batches of 256 in a shuffled order
converted to float32, torchvision's ImageFolder with the standard augmentations under a
DataLoader with 2 workers (batches of 64), and nanoGPT's get_batch (np.memmap of uint16, 12
windows of 1024 + 1 as int64 tensors). Best of --repeats runs."""
import argparse
import json
import time

import numpy as np


def report(reader, records, work, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    print(json.dumps({"reader": reader, "records": records, "seconds": round(best, 4),
                      "per_s": round(records / best, 1)}), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--csv")
    parser.add_argument("--npy", nargs=2)
    parser.add_argument("--images")
    parser.add_argument("--tokens")
    args = parser.parse_args()
    if args.csv:
        import pandas as pd

        def read():
            frame = pd.read_csv(args.csv)
            frame.drop(columns=["label"]).to_numpy(np.float32)
            frame["label"].to_numpy(np.int64)

        rows = len(pd.read_csv(args.csv))
        report("csv", rows, read, args.repeats)
    if args.npy:
        n = np.load(args.npy[1], mmap_mode="r").shape[0]

        def epoch():
            x = np.load(args.npy[0], mmap_mode="r")
            y = np.load(args.npy[1], mmap_mode="r")
            order = np.random.default_rng(0).permutation(n)
            for b in range(0, n, 256):
                idx = order[b:b + 256]
                x[idx].astype(np.float32)
                y[idx].astype(np.int64)

        report("npy", n, epoch, args.repeats)
    if args.images:
        import torch
        from torchvision import datasets, transforms
        torch.set_num_threads(1)
        transform = transforms.Compose([
            transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
            transforms.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))])
        folder = datasets.ImageFolder(args.images, transform=transform)
        loader = torch.utils.data.DataLoader(folder, batch_size=64, shuffle=True, num_workers=2,
                                             persistent_workers=False)

        def epoch():
            for _ in loader:
                pass

        report("images", len(folder), epoch, args.repeats)
    if args.tokens:
        import torch
        block_size, batch_size, batches = 1024, 12, 2000

        def get_batch():
            # nanoGPT's train.py: the memmap is made again for every batch (to avoid a leak).
            data = np.memmap(args.tokens, dtype=np.uint16, mode="r")
            ix = torch.randint(len(data) - block_size, (batch_size,))
            x = torch.stack([torch.from_numpy((data[i:i + block_size]).astype(np.int64)) for i in ix])
            y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64)) for i in ix])
            return x, y

        def run():
            for _ in range(batches):
                get_batch()

        report("tokens", batches * batch_size, run, args.repeats)


if __name__ == "__main__":
    main()
