"""recompute.py's logic on fakes (fakes.py): which saved tensors are registered, when a function
runs again, in which order dropped inputs come back, what is unregistered when."""
import gc
import unittest
import warnings

from delta.recompute import Recomputable, Recomputer, TensorInfo, qualifies

import fakes


class QualifiesTest(unittest.TestCase):
    def test_table(self):
        whole = dict(data_ptr=0x1000, storage_ptr=0x1000, nbytes=4096, storage_nbytes=4096,
                     is_leaf=False, on_device=True)
        cases = [
            ("an intermediate covering its buffer", {}, True),
            ("on the host", dict(on_device=False), False),
            ("a leaf: parameter, buffer, constant", dict(is_leaf=True), False),
            ("a view starting inside the buffer", dict(data_ptr=0x1400, nbytes=3072), False),
            ("a view of the buffer's first part", dict(nbytes=2048), False),
            ("empty", dict(nbytes=0, storage_nbytes=0), False),
            ("an input's or output's buffer", dict(storage_ptr=0x1000, data_ptr=0x1000), True),
        ]
        for name, change, expected in cases:
            with self.subTest(name):
                self.assertEqual(qualifies(TensorInfo(**dict(whole, **change)), {0x2000}), expected)
        self.assertFalse(qualifies(TensorInfo(**whole), {0x1000}), "excluded storage")
        self.assertFalse(qualifies(None, set()), "no storage")


class Fixture(unittest.TestCase):
    def setUp(self):
        self.ops = fakes.Ops()
        self.shim = fakes.Shim()
        self.recomputer = Recomputer(self.shim, lambda: self.ops)
        self.runs = []

    def wrap(self, fn, **kwargs):
        return Recomputable(fn, self.recomputer, **kwargs)

    def block(self, name="block", tail=None):
        """x -> h = 2x + random -> y = h + 1; saves x, h and y, as x*w, relu(h) would."""
        ops = self.ops

        def fn(x):
            self.runs.append(name)
            ops.save(x)
            h = ops.new(2 * x.value + ops.random())
            self.shim.manage(h)
            ops.save(h)
            if tail is not None:
                tail(h)
            y = ops.new(h.value + 1)
            self.shim.manage(y)
            ops.save(y)
            return y

        return fn

    def registered(self):
        return sorted(self.shim.registered)


class RegistrationTest(Fixture):
    def test_registers_only_intermediates_that_are_whole_buffers(self):
        ops, shim = self.ops, self.shim
        weight = ops.new(3, leaf=True)
        h = g = None

        def fn(x):
            nonlocal h, g
            ops.save(x)                            # input
            ops.save(weight)                       # parameter
            h = ops.new(x.value * weight.value)
            g = ops.new(7, nbytes=3 << 20)
            host = ops.new(1, on_device=False)
            small = ops.new(5, nbytes=4096)        # below DELTA_MIN_BYTES: the shim says no
            shim.manage(h, g)
            ops.save(h)
            ops.save(fakes.Tensor(g.storage, offset=1024))  # a view: not the whole buffer
            ops.save(g)
            ops.save(host)
            ops.save(small)
            y = ops.new(h.value + 1)
            shim.manage(y)
            ops.save(y)                            # output
            return y

        x = ops.new(2)
        shim.manage(x)
        y = self.wrap(fn, cost_ns=16000)(x)
        self.assertEqual(y.value, 7)
        qualifying = (1 << 20) + (3 << 20) + 4096  # h, g and small, which the shim refuses
        self.assertEqual(shim.registered, {h.storage.ptr: 16000 * (1 << 20) // qualifying,
                                           g.storage.ptr: 16000 * (3 << 20) // qualifying},
                         "h and g, the cost shared by bytes")
        self.assertEqual(len(self.recomputer.registry), 2)

    def test_cost_measured_on_first_call_then_kept(self):
        call = self.wrap(self.block())
        call(self.ops.new(1))
        self.assertEqual(call.cost_ns, 8000)
        self.assertEqual(list(self.shim.registered.values()), [8000])

    def test_same_buffer_saved_twice_is_registered_once(self):
        ops, shim = self.ops, self.shim

        def fn(x):
            h = ops.new(x.value + 1)
            shim.manage(h)
            ops.save(h)
            ops.save(h)
            return ops.new(0)

        self.wrap(fn, cost_ns=10)(ops.new(1))
        self.assertEqual(len(shim.registered), 1)
        entry, = self.recomputer.registry.values()
        self.assertEqual(entry.handles, 2)
        ops.graph.pop()
        gc.collect()
        self.assertEqual(shim.unregistered, [], "one handle is left")
        ops.graph.pop()
        self.assertEqual(shim.unregistered, [entry.ptr])


class NotActiveTest(Fixture):
    def test_absent_or_inactive_shim_calls_fn_directly(self):
        for shim in (fakes.Shim(active=False), Absent()):
            with self.subTest(type(shim).__name__):
                recomputer = Recomputer(shim, make_ops=self.fail_if_called)
                self.assertEqual(Recomputable(lambda a, b=0: a + b, recomputer)(1, b=2), 3)

    def test_without_the_pluggable_allocator_nothing_is_registered(self):
        recomputer = Recomputer(self.shim, self.fail_if_called, allocator_in_use=lambda: False)
        call = Recomputable(lambda a: a * 2, recomputer)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertEqual(call(2), 4)
            self.assertEqual(call(3), 6)
        self.assertEqual(len(caught), 1)
        self.assertIn("use_pluggable_allocator", str(caught[0].message))

    def test_grad_off_saves_nothing_and_registers_nothing(self):
        self.ops.grad = False
        self.wrap(self.block())(self.ops.new(1))
        self.assertEqual(self.shim.registered, {})
        self.assertEqual(self.recomputer.registry, {})

    def fail_if_called(self):
        raise AssertionError("ops built although recompute is off")


class Absent:
    present = has_recompute = False

    def is_active(self):
        return False


class RegenerateTest(Fixture):
    def test_intact_buffer_is_not_recomputed(self):
        x = self.ops.new(1)
        self.wrap(self.block())(x)
        self.assertEqual(self.ops.backward(), [1003, 1002, 1])
        self.assertEqual(self.runs, ["block"])
        self.assertEqual([call for call, _ in self.shim.log], ["begin"])

    def test_dropped_buffer_is_regenerated_in_place_with_the_same_random_numbers(self):
        ops = self.ops
        x = ops.new(1)
        self.wrap(self.block())(x)
        h = ops.graph[1][1].tensor
        ops.random()  # the generator moves on before backward
        self.shim.drop(h)
        self.assertEqual(self.ops.backward(), [1003, 1002, 1])
        self.assertEqual(self.runs, ["block", "block"])
        self.assertEqual(h.value, 1002, "the original buffer holds the value again")
        self.assertEqual(ops.rng, 2, "the re-run does not consume random numbers")
        self.assertEqual(self.shim.log, [("begin", h.storage.ptr), ("recomputed", h.storage.ptr)])

    def test_rerun_stops_once_it_has_what_it_needs(self):
        tail_runs = []
        x = self.ops.new(1)
        self.wrap(self.block(tail=tail_runs.append))(x)
        self.shim.drop(self.ops.graph[1][1].tensor)
        self.ops.backward()
        self.assertEqual(len(tail_runs), 1, "the re-run ended at h, before the tail")

    def test_dropped_siblings_come_back_from_one_run(self):
        ops, shim = self.ops, self.shim

        def fn(x):
            self.runs.append("fn")
            a, b = ops.new(x.value + 1), ops.new(x.value + 2)
            shim.manage(a, b)
            ops.save(a)
            ops.save(b)
            return ops.new(0)

        self.wrap(fn, cost_ns=1)(ops.new(10))
        a, b = (packed.tensor for _, packed in ops.graph)
        shim.drop(a)
        shim.drop(b)
        self.assertEqual(ops.backward(), [12, 11])
        self.assertEqual(self.runs, ["fn", "fn"])

    def test_inputs_dropped_too_come_back_first(self):
        # outer(x) = inner(relu(x)): outer registers relu's result r, inner's input; inner
        # registers its own h. Both dropped: unpacking h regenerates r (outer again) first.
        ops, shim = self.ops, self.shim
        inner = self.wrap(self.block("inner"))

        def outer(x):
            self.runs.append("outer")
            r = ops.new(x.value + 100)
            shim.manage(r)
            ops.save(r)
            return inner(r)

        self.wrap(outer, cost_ns=1)(ops.new(0))
        self.assertEqual(len(shim.registered), 2, "outer's r and inner's h; not inner's output")
        saved = [getattr(packed, "tensor", packed) for _, packed in ops.graph]
        r = next(t for t in saved if t.value == 100)
        h = next(t for t in saved if t.value == 1200)
        shim.drop(r)
        shim.drop(h)
        self.runs.clear()
        self.assertEqual(ops.backward(), [1201, 1200, 100, 100])
        self.assertEqual(self.runs, ["outer", "inner"], "r first, then h from it")
        self.assertEqual(shim.log[:3], [("begin", h.storage.ptr), ("begin", r.storage.ptr),
                                        ("recomputed", r.storage.ptr)])
        self.assertEqual(shim.registrations, 2, "nothing registered during re-runs")

    def test_rerun_that_saves_less_is_an_error(self):
        ops, shim = self.ops, self.shim
        first = [True]

        def fn(x):
            if first.pop() if first else False:
                h = ops.new(1)
                shim.manage(h)
                ops.save(h)
            return ops.new(0)

        self.wrap(fn, cost_ns=1)(ops.new(0))
        shim.drop(ops.graph[0][1].tensor)
        with self.assertRaisesRegex(RuntimeError, "same tensors in the same order"):
            ops.backward()


class ReleaseTest(Fixture):
    def test_freed_graph_unregisters_and_lets_inputs_go(self):
        x = self.ops.new(1)
        self.wrap(self.block())(x)
        entry, = self.recomputer.registry.values()
        record = entry.record
        self.ops.backward()  # frees the graph, as backward without retain_graph does
        self.assertEqual(self.shim.unregistered, [entry.ptr])
        self.assertEqual(self.recomputer.registry, {})
        self.assertIsNone(entry.tensor)
        self.assertIsNone(record.args, "the record let its inputs go")


if __name__ == "__main__":
    unittest.main()
