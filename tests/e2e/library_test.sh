#!/usr/bin/env bash
# libdelta.so must load into any CUDA process: it may need only glibc's libraries, and it
# exports exactly the functions it interposes and its public API (everything else hidden).
# Usage: library_test.sh LIBDELTA_SO EXPORTS_MAP
set -euo pipefail
lib=$1
map=$2
fail=0

needed=$(readelf -d "$lib" | awk '/NEEDED/ {gsub(/[\[\]]/, "", $5); print $5}' | sort)
for n in $needed; do
  case $n in
    libc.so.6 | libm.so.6 | ld-linux-x86-64.so.2 | libdl.so.2 | libpthread.so.0) ;;
    *) echo "FAIL: libdelta.so needs $n (only glibc's libraries are allowed)"; fail=1 ;;
  esac
done

exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TWDBVR]$/ {print $3}' | sed 's/@.*//' | sort -u)
# The names the version script lists (delta_* stands for the public API).
allowed=$(sed -n '/global:/,/local:/p' "$map" | tr -s ' ;\t' '\n' |
  grep -E '^[a-zA-Z_][a-zA-Z0-9_]*$' | sort -u)
for symbol in $exported; do
  if ! grep -qx "$symbol" <<<"$allowed" && [[ $symbol != delta_* ]]; then
    echo "FAIL: libdelta.so exports $symbol, which exports.map does not list"
    fail=1
  fi
done
for symbol in cudaMalloc cudaFree cuMemAlloc_v2 cuGetProcAddress_v2 dlsym delta_get_stats; do
  grep -qx "$symbol" <<<"$exported" || { echo "FAIL: $symbol is not exported"; fail=1; }
done
grep -q 'std::\|_ZN' <<<"$exported" && { echo "FAIL: C++ symbols are exported"; fail=1; }
if ((fail == 0)); then
  echo "1 passed, 0 failed"
else
  echo "0 passed, 1 failed"
fi
exit $fail
