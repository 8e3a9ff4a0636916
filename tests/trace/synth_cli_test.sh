#!/bin/sh
# delta-trace synth's command line: every family writes a log that replay reads and runs at half
# its peak; the same arguments give the same bytes (plain, gzip and standard output alike); bad
# arguments give one clear line on stderr and exit status 2. Usage: synth_cli_test.sh DELTA_TRACE
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# expect STATUS PATTERN ARGS...: exit status and one stderr line matching PATTERN.
expect() {
  want=$1 pattern=$2
  shift 2
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  got=$?
  if [ "$got" != "$want" ] || ! grep -q -- "$pattern" "$tmp/err" || [ "$(wc -l <"$tmp/err")" -gt 1 ]; then
    fail "delta-trace $* -> status $got (want $want), stderr:"
    cat "$tmp/err" >&2
  fi
}

families="unet, gan, tree-rnn, wide-branches, deep-residual, attention"
expect 2 "unknown family 'vgg' (known: $families)" synth --family vgg --seed 1
expect 2 "--family is required (known: $families)" synth --seed 1
expect 2 "--seed is required" synth --family unet
expect 2 "bad --seed 'one': expected an integer >= 0" synth --family unet --seed one
expect 2 "bad --seed '-3'" synth --family unet --seed -3
expect 2 "bad --scale '0': expected a number > 0 and at most 1000" synth --family unet --seed 1 --scale 0
expect 2 "bad --scale 'big'" synth --family unet --seed 1 --scale big
expect 2 "bad --scale '5000'" synth --family unet --seed 1 --scale 5000
expect 2 "unknown --gpu 'k80' (known: v100-16gb, a100-40gb, h100-80gb, h200)" synth --family unet --seed 1 --gpu k80
expect 2 "unknown option '--depth'" synth --family unet --seed 1 --depth 3
expect 2 "unexpected argument 'extra'" synth --family unet --seed 1 extra
expect 2 "option '--output' needs a value" synth --family unet --seed 1 -o
expect 1 "cannot write $tmp/no/such/dir.log" synth --family unet --seed 1 -o "$tmp/no/such/dir.log"
"$bin" synth --help >"$tmp/help" || fail "synth --help"
grep -q '^  attention ' "$tmp/help" || fail "synth --help lists no families"
"$bin" --help | grep -q '^  synth ' || fail "delta-trace --help lists no synth"

for f in unet gan tree-rnn wide-branches deep-residual attention; do
  log=$tmp/$f.log
  "$bin" synth --family $f --seed 1 -o "$log" 2>"$tmp/err" || { fail "synth $f"; cat "$tmp/err" >&2; continue; }
  grep -q "^delta-trace synth: $f seed 1 scale 1: .*batch [0-9]*.*; [0-9]* ops, peak [0-9.]* GiB" "$tmp/err" ||
    { fail "synth $f: no summary line"; cat "$tmp/err" >&2; }
  [ ! -e "$log.partial" ] || fail "synth $f left $log.partial"
  "$bin" replay --policy lru --budget 50% "$log" >"$tmp/replay" 2>&1 &&
    grep -q '^overhead' "$tmp/replay" || { fail "replay of $f"; cat "$tmp/replay" >&2; }
  # Determinism: again, to standard output, and gzipped.
  "$bin" synth --family $f --seed 1 2>/dev/null >"$tmp/stdout.log" || fail "synth $f to stdout"
  cmp -s "$log" "$tmp/stdout.log" || fail "synth $f: standard output differs from -o FILE"
  "$bin" synth --family $f --seed 1 -o "$tmp/$f.log.gz" 2>/dev/null || fail "synth $f -o .gz"
  gzip -dc "$tmp/$f.log.gz" | cmp -s "$log" - || fail "synth $f: the .gz holds other bytes"
  "$bin" synth --family $f --seed 1 -o "$tmp/again.log.gz" 2>/dev/null
  cmp -s "$tmp/$f.log.gz" "$tmp/again.log.gz" || fail "synth $f: two .gz files differ"
  "$bin" synth --family $f --seed 2 -o "$tmp/seed2.log" 2>/dev/null
  ! cmp -s "$log" "$tmp/seed2.log" || fail "synth $f: seeds 1 and 2 wrote the same"
done
# The gzip file replays as well; scale and GPU change the workload.
"$bin" replay --policy lru --budget 50% "$tmp/unet.log.gz" >"$tmp/replay" 2>&1 &&
  grep -q '^overhead' "$tmp/replay" || { fail "replay of unet.log.gz"; cat "$tmp/replay" >&2; }
"$bin" synth --family gan --seed 1 --scale 2 -o "$tmp/gan2.log" 2>"$tmp/err" &&
  grep -q 'scale 2:' "$tmp/err" || { fail "synth --scale 2"; cat "$tmp/err" >&2; }
peak() { "$bin" replay --policy lru --budget 100% "$1" | sed -n 's/^peak .*unlimited: \([0-9.]*\) GiB.*/\1/p'; }
awk -v a="$(peak "$tmp/gan.log")" -v b="$(peak "$tmp/gan2.log")" 'BEGIN { exit !(b > 1.5 * a) }' ||
  fail "synth --scale 2 did not grow the peak"
ms() { "$bin" replay --policy lru --budget 100% "$1" | sed -n 's/^time .*unlimited memory: \([0-9.]*\) ms.*/\1/p'; }
"$bin" synth --family gan --seed 1 --gpu h100-80gb -o "$tmp/gan-h100.log" 2>/dev/null
awk -v a="$(ms "$tmp/gan.log")" -v b="$(ms "$tmp/gan-h100.log")" 'BEGIN { exit !(b < a / 2) }' ||
  fail "synth --gpu h100-80gb is not faster than a100-40gb"
"$bin" sweep --csv --policies lru,dtr --budgets 50% "$tmp/tree-rnn.log" "$tmp/attention.log" >"$tmp/sweep" 2>&1 &&
  [ "$(wc -l <"$tmp/sweep")" = 5 ] || { fail "sweep over synthetic logs"; cat "$tmp/sweep" >&2; }

# An output that is not a regular file (a FIFO here; /dev/null alike) is written in place, never
# replaced by a file renamed over it.
mkfifo "$tmp/fifo.log"
timeout 20 cat "$tmp/fifo.log" >"$tmp/from-fifo" &
reader=$!
"$bin" synth --family gan --seed 1 -o "$tmp/fifo.log" 2>/dev/null || fail "synth -o FIFO"
wait "$reader"
[ -p "$tmp/fifo.log" ] || fail "synth -o FIFO replaced the FIFO"
cmp -s "$tmp/from-fifo" "$tmp/gan.log" || fail "synth -o FIFO: not the log"

[ "$failures" = 0 ] && echo "synth CLI: all passed"
exit "$failures"
