#!/usr/bin/env python3
"""The Fashion-MNIST CNN of examples/fashion_mnist in PyTorch, for a side-by-side epoch time.

conv3x3 C1 (pad 1), relu, maxpool 2, conv3x3 C2 (pad 1), relu, maxpool 2, fc 128, relu, fc 10; Adam
2e-3, batch 64, inputs normalised as the dl example does. Prints one line per epoch and a last line
`torch_seconds_per_epoch=...` for scripts/bench.

Usage: bench/torch_fashion_mnist.py [--epochs N] [--threads N] [--channels C1,C2] [--data DIR]
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
from torch import nn


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--channels", default="32,64")
    p.add_argument("--data", default=os.environ.get("DL_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    c1, c2 = (int(c) for c in a.channels.split(","))
    x = torch.from_numpy(read_idx(os.path.join(a.data, "train-images-idx3-ubyte.gz")).copy()).float()
    x = ((x / 255.0 - 0.2860) / 0.3530).unsqueeze(1)
    y = torch.from_numpy(read_idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz")).astype(np.int64))
    xt = torch.from_numpy(read_idx(os.path.join(a.data, "t10k-images-idx3-ubyte.gz")).copy()).float()
    xt = ((xt / 255.0 - 0.2860) / 0.3530).unsqueeze(1)
    yt = torch.from_numpy(read_idx(os.path.join(a.data, "t10k-labels-idx1-ubyte.gz")).astype(np.int64))
    model = nn.Sequential(nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(c2 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for epoch in range(1, a.epochs + 1):
        order = torch.randperm(x.shape[0])
        start = time.perf_counter()
        for i in range(0, x.shape[0], 64):
            idx = order[i:i + 64]
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
        times.append(time.perf_counter() - start)
        with torch.no_grad():
            acc = sum((model(xt[i:i + 500]).argmax(1) == yt[i:i + 500]).sum().item()
                      for i in range(0, xt.shape[0], 500)) / xt.shape[0]
        print(f"epoch {epoch}: {times[-1]:.1f} s, test accuracy {acc:.4f}", flush=True)
    print(f"torch_seconds_per_epoch={sum(times) / len(times):.2f}")


if __name__ == "__main__":
    main()
