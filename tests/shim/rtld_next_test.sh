#!/usr/bin/env bash
# dlsym(RTLD_NEXT, ...) under LD_PRELOAD=libdelta.so answers as without it: runs
# rtld-next-probe (rtld_next_probe.cpp) both ways and compares what it prints.
#   rtld_next_test.sh LIBDELTA PROBE LATE_LIBRARY
set -euo pipefail
libdelta="$1" probe="$2" late="$3"
plain="$("$probe" "$late")"
shimmed="$(LD_PRELOAD="$libdelta${LD_PRELOAD:+:$LD_PRELOAD}" "$probe" "$late")"
echo "without the shim:"; echo "$plain"
echo "with LD_PRELOAD=libdelta.so:"; echo "$shimmed"
if [ "$plain" != "$shimmed" ]; then
  echo "FAILED: RTLD_NEXT/RTLD_DEFAULT lookups differ under libdelta.so" >&2
  exit 1
fi
