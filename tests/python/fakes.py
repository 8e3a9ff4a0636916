"""Small stand-ins for PyTorch and libdelta, enough for recompute.py's logic to run on a CPU
without either: tensors with an address and a value, autograd's saved-tensor hooks as a stack,
and a shim that drops what a test tells it to."""
import itertools

from delta.recompute import TensorInfo


class Storage:
    def __init__(self, ptr, nbytes, value):
        self.ptr, self.nbytes, self.value = ptr, nbytes, value


class Tensor:
    """A tensor over (part of) a storage. `value` stands for the contents of the whole storage."""

    def __init__(self, storage, offset=0, nbytes=None, leaf=False, on_device=True):
        self.storage, self.offset = storage, offset
        self.nbytes = storage.nbytes - offset if nbytes is None else nbytes
        self.leaf, self.on_device = leaf, on_device

    @property
    def value(self):
        return self.storage.value


class Ops:
    """recompute.py's ops over fake tensors. A fake op saves a tensor with save(); backward()
    unpacks everything saved, in reverse order, as autograd's engine would."""

    def __init__(self):
        self._addresses = itertools.count(0x10000000, 0x100000)
        self.stack = []        # saved_tensors_hooks in force, innermost last
        self.graph = []        # (unpack hook, packed value) of each saved tensor
        self.grad = True
        self.rng = 0           # a random generator's state: random() advances it
        self.replays = 0

    # ---- for the tests' fake functions --------------------------------------------------

    def new(self, value, nbytes=1 << 20, leaf=False, on_device=True):
        return Tensor(Storage(next(self._addresses), nbytes, value), leaf=leaf, on_device=on_device)

    def save(self, tensor):
        if self.grad:  # autograd saves nothing when grad mode is off
            pack, unpack = self.stack[-1] if self.stack else (lambda t: t, lambda t: t)
            self.graph.append((unpack, pack(tensor)))

    def random(self):
        self.rng += 1
        return self.rng * 1000

    def backward(self):
        """The values of the saved tensors, last saved first, then the graph is freed."""
        values = [unpack(packed).value for unpack, packed in reversed(self.graph)]
        self.graph = []
        return values

    # ---- what recompute.py calls --------------------------------------------------------

    def tensors(self, tree):
        if isinstance(tree, Tensor):
            return [tree]
        if isinstance(tree, (list, tuple)):
            return [t for item in tree for t in self.tensors(item)]
        if isinstance(tree, dict):
            return self.tensors(list(tree.values()))
        return []

    def info(self, tensor):
        storage = tensor.storage
        return TensorInfo(storage.ptr + tensor.offset, storage.ptr, tensor.nbytes, storage.nbytes,
                          tensor.leaf, tensor.on_device)

    def detach(self, tensor):
        return Tensor(tensor.storage, tensor.offset, tensor.nbytes, True, tensor.on_device)

    def grad_enabled(self):
        return self.grad

    def hooks(self, pack, unpack):
        ops = self

        class Hooks:
            def __enter__(self):
                ops.stack.append((pack, unpack))

            def __exit__(self, *exc):
                ops.stack.pop()

        return Hooks()

    def for_replay(self, tree):
        return tree

    def capture(self, inputs, rng):
        return self.rng if rng else None

    def replay(self, fn, args, kwargs, state):
        self.replays += 1
        saved_rng, saved_grad = self.rng, self.grad
        if state is not None:
            self.rng = state
        self.grad = True
        try:
            fn(*args, **kwargs)
        finally:  # as torch.random.fork_rng does
            self.rng, self.grad = saved_rng, saved_grad

    def copy_(self, destination, source):
        destination.storage.value = source.storage.value

    def timer(self, inputs):
        class Timer:
            def elapsed_ns(self):
                return 8000
        return Timer()


class Shim:
    """The framework-managed half of delta.h over fake buffers (one per storage)."""

    has_recompute = True
    present = True

    def __init__(self, active=True):
        self.active = active
        self.registered = {}    # ptr -> cost_ns
        self.storages = {}      # ptr -> Storage, to drop its contents
        self.dropped = set()
        self.regenerating = set()
        self.log = []           # (call, ptr)
        self.unregistered = []
        self.registrations = 0

    def is_active(self):
        return self.active

    def manage(self, *tensors):
        """Tells the fake shim which buffers it manages (the real one: those it allocated)."""
        for tensor in tensors:
            self.storages[tensor.storage.ptr] = tensor.storage

    def drop(self, tensor):
        ptr = tensor.storage.ptr
        assert ptr in self.registered and ptr not in self.regenerating
        self.storages[ptr].value = "garbage"
        self.dropped.add(ptr)

    def register_framework_managed(self, ptr, cost_ns):
        if ptr not in self.storages:
            return False
        self.registered[ptr] = cost_ns
        self.registrations += 1
        return True

    def unregister(self, ptr):
        self.unregistered.append(ptr)
        if self.registered.pop(ptr, None) is None:
            return -1
        return 1 if ptr in self.dropped else 0

    def is_dropped(self, ptr):
        return ptr in self.dropped

    def begin_recompute(self, ptr):
        self.log.append(("begin", ptr))
        if ptr not in self.registered:
            return -1
        if ptr not in self.dropped:
            return 0
        self.dropped.discard(ptr)
        self.regenerating.add(ptr)
        return 1

    def recomputed(self, ptr):
        self.log.append(("recomputed", ptr))
        assert ptr in self.regenerating, "recomputed without begin_recompute"
        assert self.storages[ptr].value != "garbage", "recomputed before it was regenerated"
        self.regenerating.discard(ptr)
        return True
