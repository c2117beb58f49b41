#!/usr/bin/env bash
# Checks that C++/CUDA sources follow .clang-format, and that no function in src/ is over 120
# lines (scripts/function_lengths.py; CUDA __global__ kernels exempt); changes nothing.
#   scripts/format_check.sh            # the whole tree: src/ tests/ bench/
#   scripts/format_check.sh FILE...    # only these files
# Fix a file with: clang-format -i FILE; split a long function into named pieces.
set -euo pipefail
cd "$(dirname "$0")/.."
# The version CI pins (Debian 12's clang-format-14); another version may format differently.
if [ -z "${CLANG_FORMAT:-}" ]; then
  CLANG_FORMAT=clang-format
  command -v clang-format-14 >/dev/null 2>&1 && CLANG_FORMAT=clang-format-14
fi
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
  echo "format_check: $CLANG_FORMAT not found (apt-get install clang-format, or set CLANG_FORMAT)" >&2
  exit 2
fi
if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(find src tests bench -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) \
                         -not -path 'tests/node/*' -not -path 'tests/fixtures/*' 2>/dev/null | sort)
fi
[ ${#files[@]} -eq 0 ] && { echo "format_check: no files"; exit 0; }
bad=0
for f in "${files[@]}"; do
  if ! "$CLANG_FORMAT" --dry-run --Werror --style=file "$f" 2>/dev/null; then
    echo "needs formatting: $f"
    bad=$((bad + 1))
  fi
done
if [ "$bad" -gt 0 ]; then
  echo "format_check: $bad of ${#files[@]} files need clang-format -i" >&2
  exit 1
fi
echo "format_check: ${#files[@]} files formatted"
src_files=()
for f in "${files[@]}"; do [[ "$f" == src/* ]] && src_files+=("$f"); done
if [ ${#src_files[@]} -gt 0 ]; then
  python3 scripts/function_lengths.py --max 120 "${src_files[@]}"
  echo "format_check: no function in ${#src_files[@]} src/ files is over 120 lines"
fi
