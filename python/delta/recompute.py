"""Recompute of saved activations in the shim's framework-managed mode.

A wrapped fn runs under saved-tensor hooks. Of the tensors its forward saves for backward, those
that fn itself produced and that are a whole buffer (see qualifies) are registered with
delta_register_framework_managed once fn has returned: the shim may then drop them under memory
pressure instead of copying them to the host. When backward unpacks one, delta_begin_recompute
says whether it was dropped; only then is fn run again on its saved inputs (inputs that are
themselves dropped activations first, recursively), with the RNG state of the first run, and the
tensor saved at the same position copied back into the original buffer, at the same address.
That is torch.utils.checkpoint, except that nothing is recomputed unless the shim dropped it.

This file has no torch in it: tensors are reached through an `ops` object (torch_ops.TorchOps;
the tests pass fakes) and the shim through a `lib` object (_lib.Library).
"""
import collections
import functools
import itertools
import threading
import warnings

# What qualifies() needs to know of a tensor. is_leaf: a leaf, or a view of one (its buffer is the
# leaf's); nbytes: the bytes its elements span.
TensorInfo = collections.namedtuple(
    "TensorInfo", "data_ptr storage_ptr nbytes storage_nbytes is_leaf on_device")


def qualifies(info, excluded_storages):
    """Whether the shim may drop the buffer of a saved tensor, and we regenerate it.

    Only tensors on the device, produced inside fn (not a leaf: parameters, buffers and other
    tensors from outside; not one of fn's inputs or outputs, given as excluded storages), and
    covering their storage exactly: a view of part of a buffer cannot be dropped without losing
    the rest of it. With the pluggable allocator a storage is one managed buffer.
    """
    return (info is not None and info.on_device and not info.is_leaf and info.nbytes > 0 and
            info.data_ptr == info.storage_ptr and info.nbytes == info.storage_nbytes and
            info.storage_ptr not in excluded_storages)


def _identity(value):
    return value


def _unpack(value):
    return value.unpack() if type(value) is _Saved else value


class _StopRerun(Exception):
    """Raised by the re-run's pack hook once it holds every tensor it was asked for."""


class _Record:
    """One call of a wrapped fn: what it takes to run it again."""

    def __init__(self, fn, args, kwargs, state, input_ptrs):
        self.fn, self.args, self.kwargs, self.state = fn, args, kwargs, state  # state: RNG, autocast
        self.input_ptrs = input_ptrs
        self.entries = []  # the buffers registered for this call
        self.live = 0      # how many of them are still registered


class _Entry:
    """A registered buffer: the saved tensor at position `index` of a record's forward."""

    def __init__(self, ptr, tensor, record, index):
        self.ptr, self.tensor, self.record, self.index = ptr, tensor, record, index
        self.handles = 0  # _Saved objects autograd holds for it


class _Saved:
    """What autograd keeps for a saved tensor that may be registered. When the last one of an
    entry goes (its graph is freed), the buffer is unregistered, before the tensor can be freed:
    its address may be reused at once."""

    __slots__ = ("owner", "tensor", "index", "ptr", "nbytes", "entry")

    def __init__(self, owner, tensor, index, ptr, nbytes):
        self.owner, self.tensor, self.index, self.ptr, self.nbytes = owner, tensor, index, ptr, nbytes
        self.entry = None

    def unpack(self):
        if self.entry is not None:
            self.owner.ensure(self.entry)
        return self.tensor

    def __del__(self):
        if self.entry is not None:
            try:
                self.owner.release(self.entry)
            except Exception:  # at interpreter exit the shim and modules may be gone
                pass


class Recomputer:
    """The registry of registered buffers (address -> entry) and the logic around it."""

    def __init__(self, lib, make_ops, allocator_in_use=lambda: True):
        """lib: _lib.Library; make_ops: builds the ops object, on first use only; allocator_in_use:
        whether tensors get buffers of their own from the shim (allocator.in_use)."""
        self.lib = lib
        self.registry = {}
        self._make_ops = make_ops
        self._ops = None
        self._allocator_in_use = allocator_in_use
        self._lock = threading.RLock()  # one regeneration at a time; ensure() recurses
        self._local = threading.local()  # replaying: depth of re-runs; active: records re-running
        self._warned = False

    @property
    def ops(self):
        if self._ops is None:
            self._ops = self._make_ops()
        return self._ops

    def enabled(self):
        if not (self.lib.has_recompute and self.lib.is_active()):
            return False
        if not self._allocator_in_use():
            # Without it a storage is a piece of a cached segment: registering its address would
            # let the shim drop the whole segment.
            if not self._warned:
                self._warned = True
                warnings.warn("delta: PyTorch does not allocate through libdelta (call "
                              "delta.use_pluggable_allocator() first): nothing is recomputed")
            return False
        return True

    def run(self, fn, args, kwargs, cost_ns=None, preserve_rng_state=True):
        """fn(*args, **kwargs), its saved tensors registered. Returns (output, cost_ns): the cost
        given, or the forward time measured on this call when None was given."""
        if not self.enabled():
            return fn(*args, **kwargs), cost_ns
        ops = self.ops
        if getattr(self._local, "replaying", 0):
            # Inside another wrapper's re-run: save as in the first run, where this wrapper's hooks
            # kept its saved tensors from the outer one, but register nothing.
            with ops.hooks(ops.detach, _identity):
                return fn(*args, **kwargs), cost_ns
        if not ops.grad_enabled():
            return fn(*args, **kwargs), cost_ns

        inputs = ops.tensors((args, kwargs))
        input_ptrs = {info.storage_ptr for info in map(ops.info, inputs) if info is not None}
        record = _Record(fn, ops.for_replay(args), ops.for_replay(kwargs),
                         ops.capture(inputs, preserve_rng_state), input_ptrs)
        candidates = []
        positions = itertools.count()

        # What the hooks keep is detached: a saved output holding its own grad_fn would be a
        # reference cycle through C++ that Python's collector cannot break (pytorch#115255).
        def pack(tensor):
            index = next(positions)
            info = ops.info(tensor)
            if not qualifies(info, input_ptrs):
                return ops.detach(tensor)
            saved = _Saved(self, ops.detach(tensor), index, info.storage_ptr, info.nbytes)
            candidates.append(saved)
            return saved

        timer = ops.timer(inputs) if cost_ns is None else None
        with ops.hooks(pack, _unpack):
            output = fn(*args, **kwargs)
        if timer is not None:
            cost_ns = timer.elapsed_ns()
        # An output is used right after fn returns: never let the shim drop it.
        outputs = {info.storage_ptr for info in map(ops.info, ops.tensors(output)) if info is not None}
        self._register(record, [s for s in candidates if s.ptr not in outputs], cost_ns)
        candidates.clear()  # the hooks may outlive this call: autograd alone holds the handles
        return output, cost_ns

    def _register(self, record, candidates, cost_ns):
        first = {}
        for saved in candidates:
            first.setdefault(saved.ptr, saved)
        total = sum(saved.nbytes for saved in first.values())
        with self._lock:
            entries = {}
            for ptr, saved in first.items():
                entry = self.registry.get(ptr)
                if entry is None:
                    share = (cost_ns or 0) * saved.nbytes // max(total, 1)  # by bytes
                    if not self.lib.register_framework_managed(ptr, share):
                        continue  # not a managed buffer (e.g. below DELTA_MIN_BYTES)
                    entry = _Entry(ptr, saved.tensor, record, saved.index)
                    self.registry[ptr] = entry
                    record.entries.append(entry)
                    record.live += 1
                entries[ptr] = entry  # or another live record's entry for the same buffer
            for saved in candidates:
                saved.entry = entries.get(saved.ptr)
                if saved.entry is not None:
                    saved.entry.handles += 1

    def release(self, entry):
        """The last handle of `entry` is gone: unregister the buffer and forget it."""
        with self._lock:
            entry.handles -= 1
            if entry.handles > 0 or entry.tensor is None:
                return
            self.lib.unregister(entry.ptr)  # 1 when dropped: fine, its tensor is being freed
            if self.registry.get(entry.ptr) is entry:
                del self.registry[entry.ptr]
            entry.tensor = None
            record, entry.record = entry.record, None
            record.live -= 1
            if record.live == 0:  # nothing left to regenerate: let the inputs go
                record.fn = record.args = record.kwargs = record.state = None
                record.entries = []

    def ensure(self, entry):
        """Makes the contents of a registered buffer valid: regenerates them if they were dropped."""
        with self._lock:
            if entry.tensor is None or self.lib.begin_recompute(entry.ptr) != 1:
                return
            self._regenerate(entry.record, [entry])

    def _regenerate(self, record, needed):
        """Re-runs record's fn and restores the `needed` entries (their begin_recompute said 1)."""
        active = self._local.__dict__.setdefault("active", set())
        if record in active:
            raise RuntimeError("delta: recompute cycle: %s needs its own saved tensors"
                               % _name(record.fn))
        active.add(record)
        try:
            for ptr in sorted(record.input_ptrs):
                entry = self.registry.get(ptr)
                if entry is not None:
                    self.ensure(entry)
            for entry in record.entries:  # dropped siblings come back from the same run
                if (entry.tensor is not None and entry not in needed and
                        self.lib.is_dropped(entry.ptr) and self.lib.begin_recompute(entry.ptr) == 1):
                    needed.append(entry)
            captured = self._rerun(record, {entry.index for entry in needed})
            for entry in needed:
                self.ops.copy_(entry.tensor, captured[entry.index])
                self.lib.recomputed(entry.ptr)
        finally:
            active.discard(record)

    def _rerun(self, record, indices):
        """Runs record's fn again; returns {position: tensor} of the saved tensors at `indices`,
        stopping as soon as it has them all."""
        captured = {}
        positions = itertools.count()

        def pack(tensor):
            index = next(positions)
            tensor = self.ops.detach(tensor)
            if index in indices:
                captured[index] = tensor
                if len(captured) == len(indices):
                    raise _StopRerun()
            return tensor

        self._local.replaying = getattr(self._local, "replaying", 0) + 1
        try:
            with self.ops.hooks(pack, _identity):
                self.ops.replay(record.fn, record.args, record.kwargs, record.state)
        except Exception:
            # Ours, or the RuntimeError PyTorch before 2.1 made of it: then all were captured.
            if len(captured) != len(indices):
                raise
        finally:
            self._local.replaying -= 1
        if len(captured) != len(indices):
            raise RuntimeError("delta: running %s again saved fewer tensors than its first run: a "
                               "recomputable function must save the same tensors in the same order "
                               "every time" % _name(record.fn))
        return captured


def _name(fn):
    return getattr(fn, "__qualname__", None) or type(fn).__name__


class Recomputable:
    """fn wrapped: calling it calls fn through a Recomputer. The cost registered with each saved
    tensor is `cost_ns`, shared by bytes; None measures fn's forward once, on the first call."""

    def __init__(self, fn, recomputer, cost_ns=None, preserve_rng_state=True):
        functools.update_wrapper(self, fn, updated=())
        self.fn = fn
        self.recomputer = recomputer
        self.cost_ns = cost_ns
        self.preserve_rng_state = preserve_rng_state

    def __call__(self, *args, **kwargs):
        output, self.cost_ns = self.recomputer.run(self.fn, args, kwargs, self.cost_ns,
                                                   self.preserve_rng_state)
        return output
