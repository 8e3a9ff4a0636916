#!/usr/bin/env python3
"""Trains a torchvision model on synthetic data with DELTA's PyTorch helper.

    LD_PRELOAD=build/shim/libdelta.so DELTA_BUDGET=20GiB \\
        python3 python/examples/resnet_recompute.py --steps 20 --batch 256

PyTorch allocates through the shim (delta.use_pluggable_allocator), every block of the model's
top-level Sequentials (ResNet: its residual blocks) is recomputable (delta.recomputable), and each
step is marked (delta.mark_iteration). Without LD_PRELOAD the same model trains plainly: the
helper does nothing. The last line of stdout is one JSON object: samples/s of the steps after the
warm-up, the losses, and the shim's statistics (null without the shim).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import delta  # noqa: E402  (from this checkout)

SEED = 20240607


def parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of samples/s")
    parser.add_argument("--model", default="resnet50", help="a torchvision.models constructor")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--no-recompute", action="store_true", help="no delta.recomputable")
    parser.add_argument("--no-allocator", action="store_true",
                        help="keep PyTorch's caching allocator (the shim then only swaps)")
    return parser.parse_args()


def main():
    args = parse()
    loaded = delta.api_version() >= 2
    allocator = loaded and not args.no_allocator
    if allocator:
        delta.use_pluggable_allocator()  # before anything touches CUDA
    elif not loaded:
        print("resnet_recompute: libdelta is not preloaded: training without it", file=sys.stderr)

    import torch
    import torchvision
    if not torch.cuda.is_available():
        print("resnet_recompute: PyTorch sees no GPU", file=sys.stderr)
        return 1
    torch.manual_seed(SEED)
    model = getattr(torchvision.models, args.model)(weights=None, num_classes=args.classes).cuda()
    recomputable = 0
    if not args.no_recompute:
        for stage in model.children():
            if isinstance(stage, torch.nn.Sequential):
                for block in stage:
                    delta.recomputable(block)
                    recomputable += 1
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    losses, began = [], None
    for step in range(args.steps):
        if step == args.warmup:
            torch.cuda.synchronize()
            began = time.perf_counter()
        delta.mark_iteration()
        generator = torch.Generator(device="cuda")
        generator.manual_seed(SEED + step)
        images = torch.randn(args.batch, 3, args.image_size, args.image_size, device="cuda",
                             generator=generator)
        labels = torch.randint(0, args.classes, (args.batch,), device="cuda", generator=generator)
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    timed = args.steps - args.warmup
    seconds = time.perf_counter() - began if began is not None else None
    losses = [float(loss) for loss in losses]
    for step, loss in enumerate(losses):
        print(f"step {step}: loss {loss:.6f}")

    result = {
        "model": args.model, "batch": args.batch, "steps": args.steps,
        "samples_per_s": args.batch * timed / seconds if seconds and timed > 0 else None,
        "loss": losses[-1] if losses else None, "losses": losses,
        "recomputable_modules": recomputable, "pluggable_allocator": allocator,
        "delta": {"version": delta.version(), "api_version": delta.api_version(),
                  "active": delta.is_active()},
        "stats": delta.stats(),
        "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
    }
    if not allocator:  # the caching allocator's figures; the pluggable one keeps none
        result["max_allocated_bytes"] = torch.cuda.max_memory_allocated()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
