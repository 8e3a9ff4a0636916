#!/usr/bin/env bash
# Tests scripts/gpu-play where there is no GPU: with the cudasim player in place of
# delta-play-cuda, on a synthetic DTR log, it plays the trace without and under the shim and
# prints a line for each; bad arguments exit 2.
# Usage: gpu_play_test.sh SOURCE_ROOT BUILD_ROOT
set -uo pipefail
source_root=$1
build_root=$2
script=$source_root/scripts/gpu-play
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; failed=1; }

mkdir "$tmp/traces"
"$build_root/tools/delta-trace" synth --family deep-residual --seed 1 --scale 0.05 \
  -o "$tmp/traces/resnet-synth.log" 2>/dev/null || bad "delta-trace synth failed"
PLAY=$build_root/tools/play/delta-play SHIM=$build_root/shim/libdelta.so PLAY_ARGS="--scale 1" \
  GPU_PLAY_SHARES="40" GPU_PLAY_POLICIES="delta lru" CUDASIM_DEVICE_MEMORY=16G \
  "$script" "$tmp/traces" "$tmp/out" >"$tmp/stdout" 2>&1
status=$?
cat "$tmp/stdout"
[[ $status == 0 ]] && ok "exit 0" || bad "exit $status"
grep -Eq '^resnet plain: [0-9.]+ ms$' "$tmp/stdout" && ok "the plain run" || bad "no plain line"
for policy in delta lru; do
  grep -Eq "^resnet $policy 40%: [0-9.]+ ms, [+-][0-9.]+ % evictions=[0-9]+ .*over_budget_launches=0 unanalysed_launches=0$" \
    "$tmp/stdout" && ok "$policy under the shim" || bad "no $policy line as expected"
done
grep -q '^==== resnet lru 40%: ' "$tmp/out/gpu-play.log" && ok "the log holds each run" ||
  bad "the log lacks the runs"

"$script" "$tmp/nowhere" >"$tmp/bad" 2>&1
status=$?
[[ $status == 2 ]] && grep -q '^usage: scripts/gpu-play' "$tmp/bad" && ok "a missing directory: usage, exit 2" ||
  bad "a missing directory: exit $status"
mkdir "$tmp/empty"
PLAY=$build_root/tools/play/delta-play SHIM=$build_root/shim/libdelta.so "$script" "$tmp/empty" "$tmp/o2" >"$tmp/bad" 2>&1
status=$?
[[ $status == 2 ]] && grep -q 'no \*.log or \*.log.gz' "$tmp/bad" && ok "no traces: exit 2" ||
  bad "no traces: exit $status"
exit $failed
