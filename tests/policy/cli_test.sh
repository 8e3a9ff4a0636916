#!/bin/sh
# delta-trace's command line: bad options and bad files give one clear line on stderr and a
# non-zero exit; good runs work on the project's own fixture. Usage: cli_test.sh DELTA_TRACE FIXTURES_DIR
set -u
bin=$1
fixtures=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect STATUS PATTERN ARGS...: exit status and a stderr line matching PATTERN (one line).
expect() {
  want=$1 pattern=$2
  shift 2
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  got=$?
  lines=$(wc -l <"$tmp/err")
  if [ "$got" != "$want" ] || ! grep -q -- "$pattern" "$tmp/err" || [ "$lines" -gt 1 ]; then
    echo "FAIL: delta-trace $* -> status $got (want $want), stderr:" >&2
    cat "$tmp/err" >&2
    failures=$((failures + 1))
  fi
}

fx=$fixtures/tiny_dtr.log
printf 'not a trace\n' >"$tmp/bad.txt"
printf '{"INSTRUCTION":"NOPE"}\n' >"$tmp/bad.log"
printf '\037\213garbage' >"$tmp/bad.gz"

expect 2 "unknown command 'frobnicate'" frobnicate
expect 2 "unknown option '--bogus'" replay --bogus --policy delta --budget 50% "$fx"
expect 2 "unknown policy 'fifo' (accepted: delta, lru, dtr, swap-only, recompute-only, belady, oracle)" replay --policy fifo --budget 50% "$fx"
expect 2 "--policy is required" replay --budget 50% "$fx"
expect 2 "--budget is required" replay --policy delta "$fx"
expect 2 "bad --budget '12Q'" replay --policy delta --budget 12Q "$fx"
expect 2 "bad --budget '-5%'" replay --policy delta --budget -5% "$fx"
expect 2 "bad --h2d-gbps 'fast'" replay --policy delta --budget 50% --h2d-gbps fast "$fx"
expect 2 "option '--policy' needs a value" replay --budget 50% "$fx" --policy
expect 2 "expected exactly one trace FILE" replay --policy delta --budget 50%
expect 2 "bad budget 'x' in --budgets" sweep --budgets 30%,x "$fx"
expect 2 "unknown policy 'nope'" sweep --policies delta,nope "$fx"
expect 2 "bad --max-overhead 'lots'" maxbatch --policy delta --budget 50% --max-overhead lots "$fx"
expect 2 "bad --as-played '0'" replay --policy delta --budget 50% --as-played 0 "$fx"
expect 2 "--played-recompute goes with --as-played N" sweep --played-recompute "$fx"
expect 2 "--as-played and --batch do not go together" replay --policy delta --budget 50% --as-played 8 --batch 2 "$fx"
expect 2 "unknown option '--as-played'" maxbatch --policy delta --budget 50% --as-played 8 "$fx"
expect 1 "No such file or directory" replay --policy delta --budget 50% "$tmp/missing.log"
expect 1 "unrecognised trace format" replay --policy delta --budget 50% "$tmp/bad.txt"
expect 1 "bad.log:1: unknown instruction \"NOPE\"" replay --policy delta --budget 50% "$tmp/bad.log"
expect 1 "bad.gz" sweep "$tmp/bad.gz"
# PyTorch traces: the Execution Trace is the FILE; its Kineto trace and a GPU are options.
et=$fixtures/tiny_et.json
kineto=$fixtures/tiny_kineto.json
expect 2 "unknown --gpu 'k80' (known: v100-16gb, a100-40gb, h100-80gb, h200)" replay --policy delta --budget 50% --gpu k80 "$et"
expect 2 "--kineto pairs with one Execution Trace" sweep --kineto "$kineto" "$et" "$et"
expect 1 "apply to PyTorch Execution Traces only" replay --policy delta --budget 50% --gpu h200 "$fx"
expect 1 "a Kineto trace holds no tensors" replay --policy delta --budget 50% "$kineto"
expect 1 "missing.json: cannot open" replay --policy delta --budget 50% --kineto "$tmp/missing.json" "$et"

# Good runs.
for cmd in replay sweep maxbatch; do
  "$bin" $cmd --help >/dev/null || { echo "FAIL: $cmd --help" >&2; failures=$((failures + 1)); }
done
"$bin" replay --policy delta --budget 70% "$fx" >"$tmp/out" 2>&1 &&
  grep -q '^overhead' "$tmp/out" || { echo "FAIL: replay" >&2; cat "$tmp/out" >&2; failures=$((failures + 1)); }
# Memory is short: delta plans, and says what with the predicted time of each candidate, the
# fresh starts, dropping on demand and mixed under both priors among them ("as adopted" after
# the figures of each one checked).
t='[0-9.]+ ms( as adopted)?'
grep -Eq "^plan +(mixed|swap-only|recompute-only)(/net|/on-demand|/far)?(/fresh)?(/optimistic)?(/vetoed-[0-9]+)? \\(predicted per iteration: mixed(/optimistic)? $t, mixed(/optimistic)? $t,.* recompute-only/on-demand $t,.* swap-only/fresh $t," "$tmp/out" ||
  { echo "FAIL: replay shows no plan" >&2; cat "$tmp/out" >&2; failures=$((failures + 1)); }
"$bin" replay --policy delta --budget 70% --no-plan "$fx" >"$tmp/out" 2>&1 &&
  grep -q '^overhead' "$tmp/out" && ! grep -q '^plan' "$tmp/out" ||
  { echo "FAIL: delta replay with --no-plan shows a plan" >&2; cat "$tmp/out" >&2; failures=$((failures + 1)); }
"$bin" replay --policy lru --budget 70% "$fx" >"$tmp/out" 2>&1 && ! grep -q '^plan' "$tmp/out" ||
  { echo "FAIL: lru replay shows a plan" >&2; cat "$tmp/out" >&2; failures=$((failures + 1)); }
"$bin" sweep --csv --policies delta,belady --budgets 50%,20000 "$fx" >"$tmp/out" 2>&1 &&
  head -1 "$tmp/out" | grep -q '^trace,policy,budget,budget_bytes,peak_bytes,overhead_pct,h2d_bytes,d2h_bytes,recompute_ns,stall_ns,over_budget_ops,swaps,drops,prefetches,plan,regret$' &&
  grep -Eq '^tiny_dtr.log,delta,50%,.*,(mixed|swap-only|recompute-only)(/net|/on-demand|/far)?(/fresh)?(/optimistic)?(/vetoed-[0-9]+)?,([0-9]+\.[0-9]{3}|inf)$' "$tmp/out" &&
  grep -Eq '^tiny_dtr.log,belady,50%,.*,,([0-9]+\.[0-9]{3}|inf)$' "$tmp/out" &&
  [ "$(wc -l <"$tmp/out")" = 5 ] || { echo "FAIL: sweep --csv" >&2; cat "$tmp/out" >&2; failures=$((failures + 1)); }
# The regret column: each policy's overhead over the oracle's on the same trace and budget (the
# oracle's own row 1.000, and its plan the rule it kept); the table has it as the last column.
"$bin" sweep --csv --policies oracle,lru --budgets 50% "$fx" >"$tmp/out" 2>&1 &&
  grep -Eq '^tiny_dtr.log,oracle,50%,.*,(mixed|swap-only|drop-first|drop-only)/(cost|farthest)/[a-z/0-9.-]+,1\.000$' "$tmp/out" &&
  grep -Eq '^tiny_dtr.log,lru,50%,.*,,([0-9]+\.[0-9]{3}|inf)$' "$tmp/out" ||
  { echo "FAIL: sweep --csv regret" >&2; cat "$tmp/out" >&2; failures=$((failures + 1)); }
"$bin" sweep --policies oracle --budgets 50% "$fx" >"$tmp/out" 2>&1 &&
  head -1 "$tmp/out" | grep -Eq ' over +regret$' &&
  grep -Eq '^tiny_dtr.log +oracle +50% .* 1\.00x$' "$tmp/out" ||
  { echo "FAIL: sweep regret column" >&2; cat "$tmp/out" >&2; failures=$((failures + 1)); }
"$bin" replay --policy oracle --budget 50% "$fx" >"$tmp/out" 2>&1 &&
  grep -Eq '^plan +[a-z-]+/(cost|farthest)/.* \(candidates: mixed/cost/gross [0-9.]+ %' "$tmp/out" ||
  { echo "FAIL: oracle replay shows no plan" >&2; cat "$tmp/out" >&2; failures=$((failures + 1)); }
"$bin" replay --policy lru --budget 100% --iterations 2 --gpu v100-16gb "$et" >"$tmp/out" 2>"$tmp/err" &&
  grep -q '^ops  *6 per iteration, 6 buffers' "$tmp/out" &&
  grep -q 'durations from the cost model for v100-16gb' "$tmp/err" &&
  grep -q 'batch 64' "$tmp/err" || { echo "FAIL: replay of an ET" >&2; cat "$tmp/out" "$tmp/err" >&2; failures=$((failures + 1)); }
# Kernel time 131 µs, all of it joined: one iteration replays in 0.13 ms.
"$bin" replay --policy lru --budget 100% --iterations 2 --kineto "$kineto" "$et" >"$tmp/out" 2>"$tmp/err" &&
  grep -q '^time  *0.13 ms (unlimited memory: 0.13 ms)' "$tmp/out" &&
  grep -q '100.0 % of the iteration.s GPU time (0.13 ms over 6 kernels)' "$tmp/err" ||
  { echo "FAIL: replay of an ET with Kineto" >&2; cat "$tmp/out" "$tmp/err" >&2; failures=$((failures + 1)); }
"$bin" maxbatch --policy delta --budget 1M --max-overhead 20% "$et" >"$tmp/out" 2>/dev/null &&
  grep -q '^unpaged factor' "$tmp/out" && grep -q '^max batch factor' "$tmp/out" ||
  { echo "FAIL: maxbatch of an ET" >&2; cat "$tmp/out" >&2; failures=$((failures + 1)); }
"$bin" maxbatch --policy delta --budget 100% --max-overhead 20% "$fx" >"$tmp/out" 2>&1 &&
  grep -q '^max batch factor' "$tmp/out" || { echo "FAIL: maxbatch" >&2; cat "$tmp/out" >&2; failures=$((failures + 1)); }

# As delta-play --scale 8 plays it under the shim: the fixture's buffers all fall below 1 MiB,
# so nothing is managed, and nothing is short whatever the budget.
"$bin" replay --policy delta --budget 10% --as-played 8 --played-recompute "$fx" >"$tmp/out" 2>&1 &&
  grep -q '^overhead  *0.00 %' "$tmp/out" && grep -q '^peak  *0 bytes' "$tmp/out" ||
  { echo "FAIL: replay --as-played" >&2; cat "$tmp/out" >&2; failures=$((failures + 1)); }

[ "$failures" = 0 ] && echo "cli: all passed"
exit "$failures"
