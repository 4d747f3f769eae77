#!/usr/bin/env bash
# The test-name check: every Catch2 test case of the given test binaries becomes exactly one
# CTest of the same name. catch_discover_tests (Catch2 v2's CatchAddTests.cmake) reads the
# binary's --list-test-names-only output as a CMake list, so a name with a ';' becomes two
# CTests that run nothing of it, and a name with an unbalanced '[' swallows every name
# after it up to the next ']' into one CTest (one such name made an 8,687-character CTest
# of dozens of test cases). Such a name is refused here, naming it and the fix.
#
#   tools/check_test_names.sh build/tests/tp_tests build/tests/tp_shard_tests
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: tools/check_test_names.sh TEST_BINARY..." >&2; exit 2; }
listing=$(mktemp)
trap 'rm -f "$listing"' EXIT
status=0
for exe in "$@"; do
  "$exe" --list-test-names-only > "$listing" || true  # Catch2 v2 exits with the number of tests
  python3 - "$exe" "$listing" <<'PY' || status=1
import sys

exe, listing = sys.argv[1], sys.argv[2]
bad = []
names = [n for n in open(listing, encoding="utf-8").read().split("\n") if n]
if not names:
    sys.exit(f"check_test_names: {exe} --list-test-names-only listed no test cases")
for name in names:
    depth, unbalanced = 0, False
    for c in name:
        depth += (c == "[") - (c == "]")
        unbalanced |= depth < 0
    if ";" in name:
        bad.append(f"{name!r}: a ';' splits it into two CTests (write ',' or ':')")
    if depth != 0 or unbalanced:
        bad.append(f"{name!r}: unbalanced '[' / ']' join it with the names after it into one CTest "
                   "(balance them, or write the range in words)")
    if name.endswith("\\"):
        bad.append(f"{name!r}: a trailing '\\' escapes the list separator after it")
if bad:
    print(f"check_test_names: {exe}: {len(bad)} test case name(s) would not be one CTest each:")
    for b in bad:
        print("  " + b)
    sys.exit(1)
print(f"check_test_names: {exe}: {len(names)} test cases, each one CTest")
PY
done
exit $status
