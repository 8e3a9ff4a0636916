"""ctypes bindings to the libdelta.so loaded in this process (shim/include/delta/delta.h).

The functions are looked up among the symbols the process already has (ctypes.CDLL(None), i.e.
dlsym(RTLD_DEFAULT)), never loaded: the same program runs with and without the shim. When
`delta_api_version` is absent the shim is not loaded, and every method is a no-op that answers
"not active". Functions newer than the loaded library are absent too and answer the same way.
"""
import ctypes

# struct delta_stats, in the header's order. Appending is how the header grows it.
STATS_FIELDS = (
    "budget_bytes",
    "resident_bytes",
    "peak_resident_bytes",
    "live_buffers",
    "evictions",
    "restores",
    "bytes_to_host",
    "bytes_to_device",
    "stall_ns",
    "over_budget_launches",
    "unanalysed_launches",
    # Since API version 2.
    "drops",
    "recomputes",
    "recompute_failures",
    "recompute_ns",
)


class Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in STATS_FIELDS]


_ptr = ctypes.c_void_p
_int = ctypes.c_int
# name: (restype, argtypes)
_SIGNATURES = {
    "delta_api_version": (_int, []),
    "delta_version": (ctypes.c_char_p, []),
    "delta_is_active": (_int, []),
    "delta_get_stats": (_int, [ctypes.POINTER(Stats), ctypes.c_size_t]),
    "delta_pin": (_int, [_ptr]),
    "delta_unpin": (_int, [_ptr]),
    "delta_mark_iteration": (_int, []),
    "delta_register_framework_managed": (_int, [_ptr, ctypes.c_uint64]),
    "delta_unregister": (_int, [_ptr]),
    "delta_is_dropped": (_int, [_ptr]),
    "delta_begin_recompute": (_int, [_ptr]),
    "delta_recomputed": (_int, [_ptr]),
    "delta_declare_extent": (_int, [_ptr, ctypes.c_size_t]),
}

# What framework-managed recompute needs; all in API version 2.
_RECOMPUTE = ("delta_register_framework_managed", "delta_unregister", "delta_is_dropped",
              "delta_begin_recompute", "delta_recomputed")


def address(ptr):
    """A device address from an int or from anything with data_ptr() (a torch.Tensor)."""
    return ptr.data_ptr() if hasattr(ptr, "data_ptr") else int(ptr)


class Library:
    """The delta_* functions of one symbol namespace (by default the process's)."""

    def __init__(self, handle=None):
        if handle is None:
            handle = ctypes.CDLL(None)
        self._fn = {}
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                function = getattr(handle, name)
            except AttributeError:
                continue
            function.restype = restype
            function.argtypes = argtypes
            self._fn[name] = function
        self.present = "delta_api_version" in self._fn
        self.has_recompute = (self.present and self.api_version() >= 2 and
                              all(name in self._fn for name in _RECOMPUTE))

    def _call(self, name, *args, absent=-1):
        function = self._fn.get(name) if self.present else None
        return absent if function is None else function(*args)

    def api_version(self):
        """DELTA_API_VERSION of the loaded library; 0 when the shim is not loaded."""
        return self._call("delta_api_version", absent=0)

    def version(self):
        """The library's version ("0.1.0"); None when the shim is not loaded."""
        text = self._call("delta_version", absent=None)
        return text.decode() if text is not None else None

    def is_active(self):
        """True when the shim manages memory (it has seen the first CUDA allocation)."""
        return self._call("delta_is_active", absent=0) == 1

    def stats(self):
        """struct delta_stats as a dict; None when the shim is not loaded or not active."""
        stats = Stats()
        if self._call("delta_get_stats", ctypes.byref(stats), ctypes.sizeof(stats)) != 0:
            return None
        return {name: getattr(stats, name) for name in STATS_FIELDS}

    def mark_iteration(self):
        self._call("delta_mark_iteration", absent=0)

    def pin(self, ptr):
        """Never evict the buffer holding ptr. False when it is not managed."""
        return self._call("delta_pin", address(ptr)) == 0

    def unpin(self, ptr):
        return self._call("delta_unpin", address(ptr)) == 0

    def declare_extent(self, ptr, nbytes):
        """A block of a framework's own virtual memory (PyTorch's expandable segments) at ptr
        spans nbytes: a kernel's pointer into it reaches no further (delta.h, API version 3).
        False when ptr is not in such memory or the library is older."""
        return self._call("delta_declare_extent", address(ptr), max(0, int(nbytes))) == 0

    # ---- framework-managed recompute (API version 2) -------------------------------------

    def register_framework_managed(self, ptr, cost_ns):
        """True when the shim may now drop the buffer at ptr (it manages it)."""
        return self._call("delta_register_framework_managed", address(ptr), max(0, int(cost_ns))) == 0

    def unregister(self, ptr):
        """-1: not managed; 0: done; 1: done, and the contents were dropped."""
        return self._call("delta_unregister", address(ptr))

    def is_dropped(self, ptr):
        return self._call("delta_is_dropped", address(ptr)) == 1

    def begin_recompute(self, ptr):
        """1: the contents were dropped; regenerate them, then call recomputed(ptr)."""
        return self._call("delta_begin_recompute", address(ptr))

    def recomputed(self, ptr):
        return self._call("delta_recomputed", address(ptr)) == 0


_library = None


def library():
    """The process's libdelta, looked up once."""
    global _library
    if _library is None:
        _library = Library()
    return _library
