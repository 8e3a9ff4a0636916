"""DELTA's PyTorch helper: the shim's C API from Python, PyTorch's allocations through the shim,
and recompute of saved activations that the shim dropped. See docs/python.md.

Everything works with and without libdelta.so preloaded: without it, the queries answer "not
active" and recomputable functions are called as they are.

    import delta
    delta.use_pluggable_allocator()          # first, before anything touches CUDA
    model.layer1 = delta.recomputable(model.layer1)
    for batch in data:
        delta.mark_iteration()
        ...
    print(delta.stats())
"""
import sys

from . import _lib
from . import allocator
from .allocator import library_path, use_pluggable_allocator
from .recompute import Recomputable, Recomputer

__all__ = [
    "api_version", "declare_extent", "is_active", "library_path", "mark_iteration", "pin",
    "recomputable", "stats", "unpin", "use_pluggable_allocator", "version",
]


def api_version():
    """The loaded libdelta's API version (2 or more here); 0 when it is not loaded."""
    return _lib.library().api_version()


def version():
    """The loaded libdelta's version ("0.1.0"); None when it is not loaded."""
    return _lib.library().version()


def is_active():
    """True when the shim manages this process's memory (after its first CUDA allocation)."""
    return _lib.library().is_active()


def stats():
    """The shim's counters (struct delta_stats) as a dict; None when it is not active."""
    return _lib.library().stats()


def mark_iteration():
    """Tells the shim a training iteration starts. A no-op without the shim."""
    _lib.library().mark_iteration()


def pin(tensor_or_ptr):
    """Never evict the buffer holding it. False when the shim does not manage it."""
    return _lib.library().pin(tensor_or_ptr)


def unpin(tensor_or_ptr):
    return _lib.library().unpin(tensor_or_ptr)


def declare_extent(tensor_or_ptr, nbytes=None):
    """Tells the shim where a block of the framework's own virtual memory ends (PyTorch with
    expandable_segments:True): a kernel's pointer into it then brings back only the mappings
    under it. For a tensor, nbytes defaults to its storage's size. False when the memory is not
    the framework's own or the shim is older than API version 3."""
    if nbytes is None:
        storage = tensor_or_ptr.untyped_storage()
        return _lib.library().declare_extent(storage.data_ptr(), storage.nbytes())
    return _lib.library().declare_extent(tensor_or_ptr, nbytes)


_recomputer = None


def recomputer():
    """The process's Recomputer: the registry of the activations registered with the shim."""
    global _recomputer
    if _recomputer is None:
        def make_ops():
            from .torch_ops import TorchOps
            return TorchOps()
        _recomputer = Recomputer(_lib.library(), make_ops, allocator.in_use)
    return _recomputer


def recomputable(fn, *, cost_ns=None, preserve_rng_state=True):
    """fn, whose saved activations the shim may drop; they are recomputed only if it did.

    fn is a function of tensors or a torch.nn.Module (then its forward is wrapped in place and the
    module itself returned, so that names and state_dict keys do not change). fn must save the
    same tensors in the same order every time it runs with the same inputs, must not modify its
    inputs in place, and must return the tensors that are used after it. cost_ns: the device time
    of one forward of fn; None measures it on the first call. With preserve_rng_state, a re-run
    sees the RNG state of the first run (dropout masks are the same), as in torch.utils.checkpoint.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(fn, torch.nn.Module):
        fn.forward = Recomputable(fn.forward, recomputer(), cost_ns, preserve_rng_state)
        return fn
    return Recomputable(fn, recomputer(), cost_ns, preserve_rng_state)
