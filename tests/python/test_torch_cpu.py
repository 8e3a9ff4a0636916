"""recompute.py with PyTorch's own autograd, on the CPU: torch_ops.TorchOps, with CPU tensors
taken for device tensors and a shim that "drops" a buffer by filling it with NaN. Gradients must
be bit-identical to a run without the helper, whatever was dropped.

Run as a program (meson does): exit 77, skipped, where torch is not installed."""
import sys
import unittest
import warnings

try:
    import torch
except ImportError:
    torch = None

if torch is not None:
    from delta.recompute import Recomputable, Recomputer
    from delta.torch_ops import TorchOps

    class CpuOps(TorchOps):
        @staticmethod
        def info(tensor):
            info = TorchOps.info(tensor)
            return info and info._replace(on_device=True)


class NanShim:
    """Framework-managed mode over CPU tensors: drop() overwrites every registered buffer."""

    present = has_recompute = True

    def __init__(self):
        self.registered, self.dropped, self.regenerating = set(), set(), set()
        self.recomputes = 0

    def is_active(self):
        return True

    def drop_all(self, recomputer):
        for ptr, entry in recomputer.registry.items():
            with torch.no_grad():
                entry.tensor.fill_(float("nan"))
            self.dropped.add(ptr)

    def register_framework_managed(self, ptr, cost_ns):
        self.registered.add(ptr)
        return True

    def unregister(self, ptr):
        self.registered.discard(ptr)
        return 1 if ptr in self.dropped else 0

    def is_dropped(self, ptr):
        return ptr in self.dropped

    def begin_recompute(self, ptr):
        if ptr not in self.dropped:
            return 0
        self.dropped.discard(ptr)
        self.regenerating.add(ptr)
        return 1

    def recomputed(self, ptr):
        assert ptr in self.regenerating
        self.regenerating.discard(ptr)
        self.recomputes += 1
        return True


def mlp_block(inputs, outputs, seed):
    generator = torch.Generator().manual_seed(seed)
    w1 = torch.randn(inputs, 128, generator=generator).requires_grad_()
    w2 = torch.randn(128, outputs, generator=generator).requires_grad_()

    def block(x):
        h = torch.relu(x @ w1)                                         # relu saves h
        h = torch.nn.functional.dropout(h, 0.5, training=True)        # random; mm saves its result
        return torch.tanh(h @ w2)

    return block, [w1, w2]


class TorchTest(unittest.TestCase):
    def setUp(self):
        warnings.simplefilter("ignore")  # autocast("cuda") on a machine without CUDA says so
        self.shim = NanShim()
        self.recomputer = Recomputer(self.shim, CpuOps)

    def gradients(self, model, params, drop, shape):
        torch.manual_seed(7)
        x = torch.randn(*shape).requires_grad_()
        loss = model(x).square().sum()
        if drop:
            self.assertTrue(self.recomputer.registry, "something was registered")
            parameters = {p.data_ptr() for p in params}
            self.assertFalse(parameters & set(self.recomputer.registry), "a parameter registered")
            self.shim.drop_all(self.recomputer)
        torch.manual_seed(99)  # backward must not depend on the generator's state now
        loss.backward()
        after = torch.rand(1)
        grads = [x.grad] + [p.grad for p in params]
        for p in params:
            p.grad = None
        return grads, loss.detach(), after

    def check(self, plain, wrapped, params, recomputes, shape=(32, 64)):
        expected = self.gradients(plain, params, False, shape)
        for drop in (False, True):
            got = self.gradients(wrapped, params, drop, shape)
            for a, b in zip(expected[0], got[0]):
                self.assertTrue(torch.equal(a, b), "gradients differ (drop=%s)" % drop)
            self.assertTrue(torch.equal(expected[1], got[1]))
            self.assertTrue(torch.equal(expected[2], got[2]), "the re-run used up random numbers")
        self.assertEqual(self.shim.recomputes, recomputes)
        self.assertEqual(self.recomputer.registry, {}, "backward freed the graph: unregistered")
        self.assertEqual(self.shim.registered, set())

    def wrap(self, fn):
        return Recomputable(fn, self.recomputer)

    def test_one_block(self):
        block, params = mlp_block(64, 16, 1)
        # relu's and dropout's results; the mask is a leaf, x an input, tanh's result the output
        self.check(block, self.wrap(block), params, recomputes=2)

    def test_chain_of_blocks(self):
        (b1, p1), (b2, p2) = mlp_block(64, 64, 1), mlp_block(64, 16, 2)
        w1, w2 = self.wrap(b1), self.wrap(b2)
        self.check(lambda x: b2(b1(x)), lambda x: w2(w1(x)), p1 + p2, recomputes=4)

    def test_nested_blocks(self):
        inner, params = mlp_block(64, 16, 3)
        wrapped_inner = self.wrap(inner)

        def outer(block):
            return lambda x: block(torch.sigmoid(x * 2)) * 3  # sigmoid's result: inner's input

        self.check(outer(inner), self.wrap(outer(wrapped_inner)), params, recomputes=3)

    def test_module(self):
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                    torch.nn.Linear(96, 16), torch.nn.GELU())
        plain = model.forward
        model.forward = self.wrap(plain)
        # ReLU's and Dropout's results, and GELU's input; not Linear's weight.t(), a view of a leaf
        self.check(plain, model, list(model.parameters()), recomputes=3)

    def test_residual_blocks_with_batch_norm_and_in_place_relu(self):
        class Residual(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
                self.bn1 = torch.nn.BatchNorm2d(8)
                self.relu = torch.nn.ReLU(inplace=True)
                self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
                self.bn2 = torch.nn.BatchNorm2d(8)

            def forward(self, x):
                out = self.relu(self.bn1(self.conv1(x)))
                out = self.bn2(self.conv2(out))
                out += x
                return self.relu(out)

        torch.manual_seed(5)
        blocks = [Residual(), Residual()]
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), *blocks,
                                    torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10))
        plain = [block.forward for block in blocks]
        wrapped = [self.wrap(forward) for forward in plain]

        def using(forwards):
            def run(x):
                for block, forward in zip(blocks, forwards):
                    block.forward = forward
                return model(x)
            return run

        # per block: conv1's and conv2's results (saved by the batch norms), relu's in-place result
        self.check(using(plain), using(wrapped), list(model.parameters()), recomputes=6,
                   shape=(4, 3, 8, 8))


if __name__ == "__main__":
    if torch is None:
        print("torch is not installed: skipped")
        sys.exit(77)
    unittest.main()
