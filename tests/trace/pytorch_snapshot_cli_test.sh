#!/bin/sh
# delta-trace export --pytorch-snapshot on the sample trace (sample_trace.cpp): the pickle must
# load in Python and have what PyTorch's memory viewer reads; bad input fails with one line.
# Usage: pytorch_snapshot_cli_test.sh DELTA_TRACE MAKE_SAMPLE_TRACE
# Exit 77 (skipped) without python3: its pickle module is the reference reader.
set -u
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
tool=$(abs "$1")
make_sample=$(abs "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
fail=0
expect_fail() {  # NAME STATUS PATTERN COMMAND...: exit status, a stderr pattern, no output left
  name=$1; want=$2; pattern=$3; shift 3
  "$@" >"$name.out" 2>"$name.err"; got=$?
  if [ "$got" != "$want" ] || ! grep -q -- "$pattern" "$name.err" || [ "$(wc -l < "$name.err")" != 1 ]; then
    echo "FAIL $name: exit $got (want $want), stderr:"; cat "$name.err"; fail=1
  fi
}

"$make_sample" sample.dtrace || exit 1
if ! "$tool" export --pytorch-snapshot sample.dtrace -o sample.pickle 2>export.err; then
  echo "FAIL export:"; cat export.err; exit 1
fi

# The sample allocates 6 buffers (5 managed, 1 not), frees 4, evicts 2 (a swap and a drop)
# and brings both back (a restore and a recompute); weights 1 and 2 are live at the end.
python3 - sample.pickle <<'PY' || fail=1
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
assert isinstance(d, dict) and {"segments", "device_traces"} <= d.keys(), d.keys()
assert len(d["device_traces"]) == 1, len(d["device_traces"])
trace = d["device_traces"][0]
for e in trace:
    for k in ("action", "addr", "size", "time_us", "stream", "frames"):
        assert k in e, (k, e)
    assert e["action"] in ("alloc", "free_requested", "free_completed", "segment_alloc",
                           "segment_free", "segment_map", "segment_unmap"), e
count = lambda a: sum(1 for e in trace if e["action"] == a)
want = {"alloc": 6, "segment_alloc": 6, "free_requested": 4, "free_completed": 4,
        "segment_free": 4, "segment_unmap": 2, "segment_map": 2}
got = {a: count(a) for a in want}
assert got == want, got
times = [e["time_us"] for e in trace]
assert times == sorted(times), "time_us goes backwards"
# Weight 1 was allocated with a 3-frame stack.
assert [f["name"] for f in trace[0]["frames"]] == ["0x401000", "0x402000", "0x403000"], trace[0]
segs = d["segments"]
assert sorted(s["address"] for s in segs) == [0x7000000000, 0x7002000000], segs
for s in segs:
    for k in ("device", "address", "total_size", "allocated_size", "active_size",
              "requested_size", "stream", "segment_type", "segment_pool_id", "is_expandable",
              "frames", "blocks"):
        assert k in s, (k, s)
    assert s["total_size"] == 32 << 20
    [b] = s["blocks"]
    assert b["address"] == s["address"] and b["size"] == s["total_size"], b
    assert b["state"] == "active_allocated", b
PY

printf '{"op": "CALL"}\n' > ops.json
expect_fail foreign 1 'not a DELTA trace' "$tool" export --pytorch-snapshot ops.json -o x.pickle
expect_fail missing 1 'nothing.dtrace' "$tool" export --pytorch-snapshot nothing.dtrace -o x.pickle
cp sample.dtrace bad.dtrace
printf 'X' | dd of=bad.dtrace bs=1 seek=200 conv=notrunc 2>/dev/null
expect_fail corrupt 1 'byte offset' "$tool" export --pytorch-snapshot bad.dtrace -o x.pickle
[ -e x.pickle ] || [ -e x.pickle.partial ] && { echo "FAIL corrupt: left an output behind"; fail=1; }
expect_fail usage 2 'expected -o OUT.pickle' "$tool" export --pytorch-snapshot sample.dtrace
expect_fail both 2 'one format at a time' "$tool" export --chrome sample.dtrace --pytorch-snapshot sample.dtrace -o x
size=$(wc -c < sample.dtrace)
head -c $((size - 10)) sample.dtrace > cut.dtrace
expect_fail truncated 0 'warning: cut.dtrace' "$tool" export --pytorch-snapshot cut.dtrace -o cut.pickle
python3 -c 'import pickle,sys; pickle.load(open(sys.argv[1], "rb"))' cut.pickle ||
  { echo "FAIL truncated: the export of a cut-short trace does not load"; fail=1; }

exit $fail
