"""The ctypes bindings (delta._lib) and the allocator's library lookup, in this process and in
python processes started with and without LD_PRELOAD=libdelta.so (DELTA_TEST_LIBDELTA: its path,
given by meson)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

from delta import _lib, allocator

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "python"))

# What the child reports, as JSON.
PROBE = r"""
import json, delta
report = dict(api_version=delta.api_version(), version=delta.version(),
              is_active=delta.is_active(), stats=delta.stats(), pin=delta.pin(0x1000),
              declared=delta.declare_extent(0x1000, 4096),
              library_path=delta.library_path(),
              recomputable=delta.recomputable(lambda a, b: a * b)(6, 7))
delta.mark_iteration()
try:
    delta.use_pluggable_allocator()
except RuntimeError as error:
    report["allocator_error"] = str(error)
except ImportError as error:  # torch is needed past the checks
    report["allocator_error"] = "ImportError: " + str(error)
print(json.dumps(report))
"""


def probe(preload=None):
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("DELTA_") and key != "LD_PRELOAD"}
    env["PYTHONPATH"] = PACKAGE_ROOT
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if preload:
        env["LD_PRELOAD"] = preload
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise AssertionError("probe failed (%d): %s" % (done.returncode, done.stderr))
    return json.loads(done.stdout.strip().splitlines()[-1])


class ProcessTest(unittest.TestCase):
    def test_without_the_shim_everything_reports_absent(self):
        report = probe()
        self.assertEqual(report["api_version"], 0)
        self.assertIsNone(report["version"])
        self.assertFalse(report["is_active"])
        self.assertIsNone(report["stats"])
        self.assertFalse(report["pin"])
        self.assertFalse(report["declared"])
        self.assertIsNone(report["library_path"])
        self.assertEqual(report["recomputable"], 42)
        self.assertIn("not loaded", report["allocator_error"])

    def test_with_the_shim_before_any_allocation(self):
        library = os.environ.get("DELTA_TEST_LIBDELTA")
        if not library:
            self.skipTest("DELTA_TEST_LIBDELTA is not set (meson sets it)")
        report = probe(library)
        self.assertEqual(report["api_version"], 3)
        self.assertRegex(report["version"], r"^\d+\.\d+\.\d+")
        self.assertFalse(report["is_active"], "no CUDA allocation was made")
        self.assertIsNone(report["stats"], "not active: no stats")
        self.assertFalse(report["pin"])
        self.assertFalse(report["declared"], "not active: nothing is the framework's own memory")
        self.assertEqual(os.path.realpath(report["library_path"]), os.path.realpath(library))
        self.assertEqual(report["recomputable"], 42)
        self.assertNotIn("not loaded", report.get("allocator_error", ""))


class FakeHandle:
    """Symbols as attributes, as ctypes.CDLL has them; absent ones raise AttributeError."""

    def __init__(self, **functions):
        self.__dict__.update(functions)


class LibraryTest(unittest.TestCase):
    def test_no_symbols_means_not_loaded(self):
        lib = _lib.Library(FakeHandle())
        self.assertFalse(lib.present or lib.has_recompute or lib.is_active())
        self.assertEqual(lib.api_version(), 0)
        self.assertIsNone(lib.version())
        self.assertIsNone(lib.stats())
        self.assertFalse(lib.pin(0x1000) or lib.unpin(0x1000))
        self.assertFalse(lib.register_framework_managed(0x1000, 5))
        self.assertEqual(lib.begin_recompute(0x1000), -1)
        lib.mark_iteration()

    def test_version_1_library_has_no_recompute(self):
        lib = _lib.Library(FakeHandle(delta_api_version=lambda: 1, delta_is_active=lambda: 1))
        self.assertTrue(lib.present and lib.is_active())
        self.assertFalse(lib.has_recompute)
        self.assertFalse(lib.register_framework_managed(0x1000, 5), "absent: not managed")

    def test_pointers_from_ints_and_tensors(self):
        seen = []
        lib = _lib.Library(FakeHandle(delta_api_version=lambda: 2,
                                      delta_pin=lambda ptr: seen.append(ptr) or 0))

        class Tensor:
            def data_ptr(self):
                return 0x2000

        self.assertTrue(lib.pin(0x1000) and lib.pin(Tensor()))
        self.assertEqual(seen, [0x1000, 0x2000])

    def test_declared_extents(self):
        seen = []
        lib = _lib.Library(FakeHandle(delta_api_version=lambda: 3,
                                      delta_declare_extent=lambda ptr, n: seen.append((ptr, n)) or 0))
        self.assertTrue(lib.declare_extent(0x1000, 4096))
        self.assertTrue(lib.declare_extent(0x3000, -5))  # a size below 0 is none: forget it
        self.assertEqual(seen, [(0x1000, 4096), (0x3000, 0)])
        older = _lib.Library(FakeHandle(delta_api_version=lambda: 2))
        self.assertFalse(older.declare_extent(0x1000, 4096), "absent: not declared")

    def test_stats_fields_follow_the_header(self):
        header = os.path.join(HERE, "..", "..", "shim", "include", "delta", "delta.h")
        with open(header) as text:
            body = text.read().split("struct delta_stats {", 1)[1].split("};", 1)[0]
        fields = [line.split()[1].rstrip(";") for line in body.splitlines()
                  if line.strip().startswith("uint64_t")]
        self.assertEqual(list(_lib.STATS_FIELDS), fields)


class LibraryPathTest(unittest.TestCase):
    def test_from_the_memory_map_then_ld_preload(self):
        with tempfile.TemporaryDirectory() as directory:
            maps = os.path.join(directory, "maps")
            with open(maps, "w") as out:
                out.write("7f0000000000-7f0000001000 r-xp 00000000 08:01 42   /usr/lib/libc.so.6\n"
                          "7f0000002000-7f0000003000 r-xp 00000000 00:00 0 \n"
                          "7f0000004000-7f0000005000 r-xp 00000000 08:01 43   "
                          "/opt/my delta/libdelta.so\n")
            self.assertEqual(allocator.library_path(maps, {}), "/opt/my delta/libdelta.so")
            library = os.path.join(directory, "libdelta.so")
            open(library, "w").close()
            empty = os.path.join(directory, "empty")
            open(empty, "w").close()
            self.assertEqual(allocator.library_path(empty, {"LD_PRELOAD": "libx.so " + library}),
                             library)
            self.assertIsNone(allocator.library_path(empty, {"LD_PRELOAD": "/nowhere/libdelta.so"}))
            self.assertIsNone(allocator.library_path(os.path.join(directory, "none"), {}))


if __name__ == "__main__":
    unittest.main()
