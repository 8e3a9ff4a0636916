"""Routes PyTorch's CUDA allocations to libdelta through torch's CUDAPluggableAllocator.

With the pluggable allocator every tensor storage is one cudaMalloc of the shim's, freed when the
storage dies: the shim sees exact tensor lifetimes, and a storage is a whole managed buffer, which
is what recompute needs (recompute.py registers buffers by a storage's address). PyTorch can
only switch allocators before its first CUDA allocation.
"""
import os

from . import _lib

_in_use = False


def library_path(maps="/proc/self/maps", environ=None):
    """The path of the libdelta.so loaded in this process, or None.

    From the process's memory map (the absolute path the loader used), else from LD_PRELOAD.
    """
    try:
        with open(maps) as lines:
            for line in lines:
                fields = line.split(None, 5)
                if len(fields) == 6:
                    path = fields[5].strip()
                    if _is_libdelta(path):
                        return path
    except OSError:
        pass
    preload = (os.environ if environ is None else environ).get("LD_PRELOAD", "")
    for path in preload.replace(":", " ").split():
        if _is_libdelta(path) and os.path.exists(path):
            return os.path.abspath(path)
    return None


def _is_libdelta(path):
    name = os.path.basename(path)
    return name == "libdelta.so" or name.startswith("libdelta.so.")


def in_use():
    """True once use_pluggable_allocator() has switched PyTorch to the shim."""
    return _in_use


def use_pluggable_allocator():
    """Makes PyTorch allocate CUDA memory through libdelta (delta_torch_malloc/delta_torch_free).

    Call it before anything touches CUDA (the first tensor on the GPU). Raises RuntimeError when
    the shim is not loaded or PyTorch's allocator is already in use. Returns the library's path.
    """
    global _in_use
    if _in_use:
        return library_path()
    lib = _lib.library()
    if not lib.present or lib.api_version() < 2:
        raise RuntimeError("delta.use_pluggable_allocator: libdelta (API version 2 or later) is not "
                           "loaded in this process; run under LD_PRELOAD=/path/to/libdelta.so")
    path = library_path()
    if path is None:
        raise RuntimeError("delta.use_pluggable_allocator: libdelta is loaded but its path is not in "
                           "/proc/self/maps nor in LD_PRELOAD")
    import torch  # only here: the bindings work without torch
    if not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        raise RuntimeError("delta.use_pluggable_allocator: this PyTorch (%s) has no "
                           "CUDAPluggableAllocator; it needs PyTorch 2.0 or later" % torch.__version__)
    if torch.cuda.is_initialized():
        raise RuntimeError("delta.use_pluggable_allocator: PyTorch has already initialised CUDA and "
                           "its allocator; call it first, before any tensor is put on the GPU")
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "delta_torch_malloc",
                                                         "delta_torch_free")
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as error:
        raise RuntimeError("delta.use_pluggable_allocator: PyTorch refused to switch allocators "
                           f"({error}); call it before any CUDA allocation") from None
    _in_use = True
    return path
