#!/usr/bin/env bash
# Tests scripts/gpu-check where there is no GPU: the pipeline on cudasim (--cudasim) must pass
# and write its JSON; without a GPU the real check must fail clearly (exit 1, one line, a JSON
# saying why), never pass vacuously; bad arguments exit 2.
# Usage: gpu_check_test.sh SOURCE_ROOT BUILD_ROOT
set -uo pipefail
source_root=$1
build_root=$2
script=$source_root/scripts/gpu-check
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
ok() { echo "ok: $1"; passed=$((passed + 1)); }
bad() { echo "FAIL: $1"; failed=$((failed + 1)); }
# A JSON field, by a Python expression over the parsed report `r`.
field() { python3 -c "import json, sys; r = json.load(open(sys.argv[1])); print($2)" "$1"; }

# 1. The pipeline on cudasim.
"$script" "$tmp/sim" --cudasim --build "$build_root" >"$tmp/sim.out" 2>&1
status=$?
cat "$tmp/sim.out"
json=$tmp/sim/gpu-check.json
if [[ $status == 0 && -f $json && $(field "$json" 'r["ok"]') == True ]]; then
  ok "--cudasim passes and says so in its JSON"
else
  bad "--cudasim exited $status"
fi
[[ -f $json && $(field "$json" 'r["platform"]') == cudasim ]] && ok "the JSON says cudasim" ||
  bad "platform is not cudasim"
[[ -f $json && $(field "$json" 'r["conformance"]["passed"] > 100 and not r["conformance"]["failed"]') == True ]] &&
  ok "conformance ran on cudasim" || bad "conformance results missing"
[[ -f $json && $(field "$json" 'r["workloads"][0]["checksums_equal"] and r["workloads"][0]["shim"]["stats"]["evictions"] > 0') == True ]] &&
  ok "train-mlp: same checksum under the shim, with evictions" || bad "workload results missing"
[[ -s $tmp/sim/gpu-check.log ]] && ok "the programs' output is in gpu-check.log" || bad "no log"

# 2. No GPU: an nvidia-smi that finds no device, as on a machine whose driver sees none.
mkdir -p "$tmp/bin"
printf '#!/bin/sh\necho "No devices were found"\nexit 6\n' >"$tmp/bin/nvidia-smi"
chmod +x "$tmp/bin/nvidia-smi"
PATH="$tmp/bin:/usr/bin:/bin" "$script" "$tmp/nogpu" >"$tmp/nogpu.out" 2>"$tmp/nogpu.err"
status=$?
json=$tmp/nogpu/gpu-check.json
[[ $status == 1 ]] && ok "no GPU: exit status 1" || bad "no GPU: exit status $status"
if [[ $(wc -l <"$tmp/nogpu.out") == 1 && $(head -c 22 "$tmp/nogpu.out") == "gpu-check: FAIL: no GP" && ! -s $tmp/nogpu.err ]]; then
  ok "no GPU: one clear line ($(cat "$tmp/nogpu.out"))"
else
  bad "no GPU: output was: $(cat "$tmp/nogpu.out" "$tmp/nogpu.err")"
fi
[[ -f $json && $(field "$json" 'r["ok"] is False and "No devices were found" in r["error"] and not r["checks"]') == True ]] &&
  ok "no GPU: the JSON says why" || bad "no GPU: JSON missing or wrong"

# 3. Bad arguments.
"$script" >/dev/null 2>&1
[[ $? == 2 ]] && ok "no OUTDIR: exit status 2" || bad "no OUTDIR: wrong exit status"
"$script" "$tmp/x" --cudasim >/dev/null 2>&1
[[ $? == 2 ]] && ok "--cudasim without --build: exit status 2" || bad "--cudasim without --build accepted"

# The PyTorch part needs PyTorch and a GPU: here it must at least be valid Python.
python3 -m py_compile "$source_root/scripts/gpu_check_torch.py" && ok "gpu_check_torch.py compiles" ||
  bad "gpu_check_torch.py does not compile"

echo "$passed passed, $failed failed"
((failed == 0))
