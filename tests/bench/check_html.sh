#!/usr/bin/env bash
# Renders a `tessera bench` HTML report in headless Chromium and checks that it drew something
# (a screenshot with many distinct colours) without console errors.
#   tests/bench/check_html.sh BENCH_BINARY [CHROMIUM] [WORK_DIR]
# BENCH_BINARY is the bench verb (tessera_bench_cli, or "tessera bench"); it writes the report in
# --self-test mode, so no server is needed. Set HTML=file.html to check an existing report instead.
set -euo pipefail
bench=${1:?usage: check_html.sh BENCH_BINARY [CHROMIUM] [WORK_DIR]}
chromium=${2:-chromium}
work=${3:-$(mktemp -d)}
mkdir -p "$work"
html=${HTML:-$work/report.html}
if [ -z "${HTML:-}" ]; then
  $bench --self-test --concurrency 1,5,10,20 --requests-per-level 40 --max-tokens 32 --goodput ttft:5 \
    --no-progress --html "$html" > "$work/bench.out"
fi
png=$work/screenshot.png
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
timeout 90 "$chromium" --headless --no-sandbox --disable-gpu --disable-background-networking \
  --disable-component-update --disable-sync --no-first-run --user-data-dir="$profile" \
  --enable-logging=stderr --v=0 --screenshot="$png" --window-size=1200,900 "file://$(realpath "$html")" \
  > "$work/chromium.log" 2>&1 || { cat "$work/chromium.log"; echo "FAIL: chromium exited with an error"; exit 1; }
if grep -E "Uncaught|ERROR:CONSOLE|CONSOLE\(" "$work/chromium.log"; then
  echo "FAIL: console errors while rendering $html"
  exit 1
fi
[ -s "$png" ] || { echo "FAIL: no screenshot written"; exit 1; }
python3 - "$png" <<'PY'
import struct, sys, zlib
# Decode the PNG (8-bit RGB/RGBA, as Chromium writes) and count distinct colours.
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, width, height, ctype = 8, b"", 0, 0, 0
while pos < len(data):
    length, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + length]
    if kind == b"IHDR":
        width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
        assert depth == 8 and ctype in (2, 6), f"unexpected PNG format depth={depth} type={ctype}"
    elif kind == b"IDAT":
        idat += body
    pos += 12 + length
raw = zlib.decompress(idat)
bpp = 3 if ctype == 2 else 4
stride = width * bpp
prev = bytearray(stride)
colours = set()
for y in range(height):
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    if y % 2 == 0:
        for x in range(0, stride, bpp * 2):
            colours.add(bytes(line[x:x + 3]))
    prev = line
print(f"screenshot {width}x{height}, {len(colours)} distinct colours")
assert len(colours) >= 20, "the page looks blank"
PY
echo "OK: $html rendered without console errors ($png)"
