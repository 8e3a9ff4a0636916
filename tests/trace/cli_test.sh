#!/bin/sh
# delta-trace summary/export/plot/diff on the sample trace (sample_trace.cpp): outputs compared
# with expected/ exactly; errors on foreign, corrupt and cut-short files; --help everywhere.
# Usage: cli_test.sh DELTA_TRACE MAKE_SAMPLE_TRACE EXPECTED_DIR
# DELTA_UPDATE_EXPECTED=1 rewrites the expected files instead of comparing.
set -u
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
tool=$(abs "$1")
make_sample=$(abs "$2")
expected=$(abs "$3")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
fail=0
check() {  # NAME COMMAND...: the command must succeed
  name=$1; shift
  if ! "$@" >"$name.out" 2>"$name.err"; then
    echo "FAIL $name: exit $?"; cat "$name.err"; fail=1
  fi
}
expect_fail() {  # NAME STATUS PATTERN COMMAND...: exit status and a stderr pattern
  name=$1; want=$2; pattern=$3; shift 3
  "$@" >"$name.out" 2>"$name.err"; got=$?
  if [ "$got" != "$want" ] || ! grep -q -- "$pattern" "$name.err"; then
    echo "FAIL $name: exit $got (want $want), stderr:"; cat "$name.err"; fail=1
  fi
}
golden() {  # FILE EXPECTED_NAME
  if [ "${DELTA_UPDATE_EXPECTED:-0}" = 1 ]; then
    cp "$1" "$expected/$2"
  elif ! cmp -s "$1" "$expected/$2"; then
    echo "FAIL $2 differs from the expected output:"; diff -u "$expected/$2" "$1" | head -40; fail=1
  fi
}

"$make_sample" sample.dtrace || exit 1

check summary "$tool" summary sample.dtrace
golden summary.out summary.txt
check export "$tool" export --chrome sample.dtrace -o sample.json
golden sample.json sample.chrome.json
check diff "$tool" diff sample.dtrace sample.dtrace
golden diff.out diff.txt
check plot "$tool" plot sample.dtrace -o memory.svg
grep -q '</svg>' memory.svg && grep -q 'resident (managed)' memory.svg && grep -q 'budget' memory.svg ||
  { echo "FAIL plot: not a complete SVG"; fail=1; }
if command -v python3 >/dev/null; then
  python3 -c 'import json,sys; d=json.load(open("sample.json")); assert d["traceEvents"]' ||
    { echo "FAIL export: not valid JSON"; fail=1; }
  python3 -c 'import xml.dom.minidom; xml.dom.minidom.parse("memory.svg")' ||
    { echo "FAIL plot: not well-formed XML"; fail=1; }
fi

# An output that is not a regular file (a FIFO here; /dev/null alike) is written in place, never
# replaced by a file renamed over it.
mkfifo export.fifo
timeout 20 cat export.fifo > from-fifo.json &
reader=$!
"$tool" export --chrome sample.dtrace -o export.fifo > /dev/null 2>&1 || { echo "FAIL export -o FIFO"; fail=1; }
wait "$reader"
[ -p export.fifo ] || { echo "FAIL export -o FIFO replaced the FIFO"; fail=1; }
cmp -s from-fifo.json sample.json || { echo "FAIL export -o FIFO: not the export"; fail=1; }

for cmd in summary export plot diff; do
  check "help_$cmd" "$tool" "$cmd" --help
  grep -q "usage: delta-trace $cmd" "help_$cmd.out" || { echo "FAIL $cmd --help"; fail=1; }
done

# Foreign, newer, corrupt and cut-short files.
printf '{"op": "CALL"}\n' > ops.json
expect_fail foreign 1 'not a DELTA trace' "$tool" summary ops.json
expect_fail foreign_export 1 'not a DELTA trace' "$tool" export --chrome ops.json -o x.json
expect_fail foreign_plot 1 'not a DELTA trace' "$tool" plot ops.json -o x.svg
expect_fail foreign_diff 1 'not a DELTA trace' "$tool" diff sample.dtrace ops.json
size=$(wc -c < sample.dtrace)
head -c $((size - 10)) sample.dtrace > cut.dtrace
expect_fail truncated 0 'warning: cut.dtrace: the file ends inside .*byte offset' "$tool" summary cut.dtrace
cp sample.dtrace bad.dtrace
printf 'X' | dd of=bad.dtrace bs=1 seek=200 conv=notrunc 2>/dev/null
expect_fail corrupt 1 'fails its checksum at byte offset' "$tool" summary bad.dtrace
expect_fail corrupt_export 1 'byte offset' "$tool" export --chrome bad.dtrace -o x.json
expect_fail usage 2 'expected -o' "$tool" export --chrome sample.dtrace
expect_fail usage_plot 2 'expected -o' "$tool" plot sample.dtrace

exit $fail
