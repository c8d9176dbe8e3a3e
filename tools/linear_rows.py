"""Time one float32 linear layer on the CPU against the number of rows it multiplies, torch's own
(`torch.nn.functional.linear`) and through oneDNN (`hf_specdec.pack_linears`, packed and not): what verifying k
tokens costs in each layer of a model, against one token (docs/usage.md, "On a CPU: linear layers through oneDNN").

    python tools/linear_rows.py [--out-features 8960] [--in-features 1536] [--rows 1,2,3,5,9,17]

Prints milliseconds per call (the best of 3 rounds of 20 calls, after 2 untimed ones). Run it with nothing else
running.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from hf_specdec import pack_linears


def best_ms(layer: nn.Module, rows: torch.Tensor, calls: int = 20, rounds: int = 3) -> float:
    with torch.no_grad():
        layer(rows)
        layer(rows)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                layer(rows)
            times.append((time.perf_counter() - start) / calls * 1e3)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-features", type=int, default=8960)
    parser.add_argument("--in-features", type=int, default=1536)
    parser.add_argument("--rows", default="1,2,3,5,9,17")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch_layer = nn.Linear(args.in_features, args.out_features, bias=False)
    layers = {"torch": torch_layer}
    for name, packed in (("oneDNN packed", True), ("oneDNN unpacked", False)):
        layer = nn.Linear(args.in_features, args.out_features, bias=False)
        layer.load_state_dict(torch_layer.state_dict())
        pack_linears(layer, packed=packed)
        layers[name] = layer
    print(
        f"{args.out_features} x {args.in_features} float32 linear layer, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}: ms per call"
    )
    print("rows | " + " | ".join(layers))
    for count in (int(text) for text in args.rows.split(",")):
        rows = torch.randn(count, args.in_features)
        print(f"{count} | " + " | ".join(f"{best_ms(layer, rows):.2f}" for layer in layers.values()), flush=True)


if __name__ == "__main__":
    main()
