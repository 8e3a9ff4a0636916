"""What recompute.py needs from PyTorch, in one place; imported only when recompute is active."""
import time

import torch

from .recompute import TensorInfo

_UNTYPED = hasattr(torch.Tensor, "untyped_storage")


def _tensors(tree, found):
    if isinstance(tree, torch.Tensor):
        found.append(tree)
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            _tensors(item, found)
    elif isinstance(tree, dict):
        for item in tree.values():
            _tensors(item, found)
    return found


def _map(tree, fn):
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, (list, tuple)):
        mapped = [_map(item, fn) for item in tree]
        return type(tree)(*mapped) if hasattr(tree, "_fields") else type(tree)(mapped)
    if isinstance(tree, dict):
        return type(tree)((key, _map(item, fn)) for key, item in tree.items())
    return tree


def _leaf_like(tensor):
    """The same storage, cut from the graph, requiring grad as the input did: the re-run saves
    what the first run saved, and its throwaway graph does not keep the caller's alive."""
    return tensor.detach().requires_grad_(tensor.requires_grad)


def _autocast_state():
    try:  # PyTorch 2.4 and later
        return torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    except (TypeError, AttributeError):
        return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()


class State:
    """What the re-run restores: the RNG states (cpu and the inputs' devices) and autocast."""

    def __init__(self, inputs, rng):
        self.autocast = _autocast_state()
        self.devices = sorted({t.device.index for t in inputs if t.is_cuda}) if rng else []
        self.cpu_rng = torch.get_rng_state() if rng else None
        self.cuda_rng = [torch.cuda.get_rng_state(device) for device in self.devices]


class _Timer:
    """fn's forward time: CUDA events on the current stream (one synchronisation, on the first
    call only), host time without a device."""

    def __init__(self, on_device):
        self.start_ns = time.perf_counter_ns()
        self.events = None
        if on_device:
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record()

    def elapsed_ns(self):
        if self.events is None:
            return time.perf_counter_ns() - self.start_ns
        self.events[1].record()
        self.events[1].synchronize()
        return int(self.events[0].elapsed_time(self.events[1]) * 1e6)


class TorchOps:
    tensors = staticmethod(lambda tree: _tensors(tree, []))

    @staticmethod
    def info(tensor):
        try:
            storage = tensor.untyped_storage() if _UNTYPED else tensor.storage()  # before 2.0
            # A view of a parameter (weight.t() in F.linear) is no leaf, but its buffer is the
            # parameter's: count it as one.
            base = tensor._base
            return TensorInfo(tensor.data_ptr(), storage.data_ptr(),
                              tensor.numel() * tensor.element_size(), storage.nbytes(),
                              tensor.is_leaf or (base is not None and base.is_leaf),
                              tensor.is_cuda)
        except (RuntimeError, NotImplementedError, AttributeError):  # no storage (fake, sparse)
            return None

    @staticmethod
    def detach(tensor):
        return tensor.detach()

    @staticmethod
    def grad_enabled():
        return torch.is_grad_enabled()

    @staticmethod
    def hooks(pack, unpack):
        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    @staticmethod
    def for_replay(tree):
        return _map(tree, _leaf_like)

    @staticmethod
    def capture(inputs, rng):
        return State(inputs, rng)

    @staticmethod
    def replay(fn, args, kwargs, state):
        """fn(*args, **kwargs) again as in its first run: RNG and autocast as then, grad on."""
        rng = state.cpu_rng is not None
        with torch.random.fork_rng(devices=state.devices, enabled=rng):
            if rng:
                torch.set_rng_state(state.cpu_rng)
                for device, cuda_rng in zip(state.devices, state.cuda_rng):
                    torch.cuda.set_rng_state(cuda_rng, device)
            enabled, dtype = state.autocast
            with torch.enable_grad(), torch.autocast("cuda", enabled=enabled, dtype=dtype):
                fn(*args, **kwargs)

    @staticmethod
    def copy_(destination, source):
        if destination.shape != source.shape or destination.dtype != source.dtype:
            raise RuntimeError("delta: the re-run saved a %s %s tensor where the first run saved a "
                               "%s %s one: the function does not save the same tensors every time"
                               % (tuple(source.shape), source.dtype, tuple(destination.shape),
                                  destination.dtype))
        with torch.no_grad():
            destination.copy_(source)

    @staticmethod
    def timer(inputs):
        return _Timer(any(t.is_cuda for t in inputs))

