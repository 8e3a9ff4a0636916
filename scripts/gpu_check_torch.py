#!/usr/bin/env python3
"""The PyTorch part of scripts/gpu-check: torchvision ResNet-50 training steps on synthetic data.

  gpu_check_torch.py search --cap-bytes C
      the largest batch whose training steps fit in C bytes of device memory, the cap enforced
      with torch.cuda.set_per_process_memory_fraction (doubling, then bisecting to a multiple
      of 4; each candidate runs two steps, the second with the optimizer's state allocated)
  gpu_check_torch.py train --batch B --steps N [--cap-bytes C]
      N steps at batch B from the same seed: the loss after them and the samples per second of
      the steps after the first; with --cap-bytes, under that cap as above. Run it under
      LD_PRELOAD=libdelta.so with DELTA_BUDGET instead of a cap to hold it to the budget.

The last line of stdout is `RESULT {json}`. Determinism: the weights, the data (generated on
the GPU from the seed and the step) and the algorithms (deterministic cuDNN, no TF32;
CUBLAS_WORKSPACE_CONFIG is set before CUDA starts) are the same in every run, so the loss
after N steps at one batch is the same with and without the shim, up to the few operations
PyTorch has no deterministic kernel for (warned about, not refused).
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402  (after the environment it reads)
import torchvision  # noqa: E402

IMAGE = 224
CLASSES = 1000
SEED = 20240607


def deterministic():
    torch.manual_seed(SEED)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)


def cap_memory(cap_bytes):
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), 0)


def make_model():
    torch.manual_seed(SEED)
    model = torchvision.models.resnet50(weights=None, num_classes=CLASSES).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, optimizer


def batch_for(step, batch):
    generator = torch.Generator(device="cuda")
    generator.manual_seed(SEED + step)
    images = torch.randn(batch, 3, IMAGE, IMAGE, device="cuda", generator=generator)
    labels = torch.randint(0, CLASSES, (batch,), device="cuda", generator=generator)
    return images, labels


def train_step(model, optimizer, step, batch):
    images, labels = batch_for(step, batch)
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss


def fits(batch):
    """Two steps at `batch` under the cap: True, or False on out-of-memory."""
    model, optimizer = make_model()
    try:
        for step in range(2):
            train_step(model, optimizer, step, batch)
        torch.cuda.synchronize()
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        del model, optimizer
        torch.cuda.empty_cache()


def search(args):
    cap_memory(args.cap_bytes)
    trials = []
    low, high = 0, None
    batch = 8
    while high is None and batch <= args.max_batch:
        ok = fits(batch)
        trials.append([batch, ok])
        if ok:
            low, batch = batch, batch * 2
        else:
            high = batch
    if high is None:
        high = args.max_batch + 1
    while high - low > 4:
        middle = (low + high) // 2 // 4 * 4
        if middle <= low:
            break
        ok = fits(middle)
        trials.append([middle, ok])
        if ok:
            low = middle
        else:
            high = middle
    return {"largest_batch": low, "trials": trials}


def train(args):
    if args.cap_bytes:
        cap_memory(args.cap_bytes)
    model, optimizer = make_model()
    losses = []
    began = None
    for step in range(args.steps):
        if step == 1:
            torch.cuda.synchronize()
            began = time.perf_counter()
        losses.append(train_step(model, optimizer, step, args.batch))
    torch.cuda.synchronize()
    seconds = time.perf_counter() - began if began is not None else float("nan")
    timed = args.steps - 1
    return {"batch": args.batch, "steps": args.steps,
            "losses": [float(loss) for loss in losses], "loss": float(losses[-1]),
            "samples_per_s": args.batch * timed / seconds if timed > 0 else None,
            "max_allocated_bytes": torch.cuda.max_memory_allocated(),
            "max_reserved_bytes": torch.cuda.max_memory_reserved()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    search_parser = sub.add_parser("search")
    search_parser.add_argument("--cap-bytes", type=int, required=True)
    search_parser.add_argument("--max-batch", type=int, default=1024)
    train_parser = sub.add_parser("train")
    train_parser.add_argument("--batch", type=int, required=True)
    train_parser.add_argument("--steps", type=int, default=4)
    train_parser.add_argument("--cap-bytes", type=int, default=0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check_torch: PyTorch sees no GPU", file=sys.stderr)
        return 1
    deterministic()
    result = search(args) if args.command == "search" else train(args)
    result["torch"] = torch.__version__
    result["device"] = torch.cuda.get_device_name(0)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
