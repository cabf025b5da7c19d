#!/bin/sh
# Start a built bundle as a new user would: a fresh home (no settings, no caches), the bundled model, a real
# X display (Xvfb), one message sent, a screenshot of the window after the reply, then exit. Fails when the
# bundle does not start, the model does not load or the reply fails.
#
#     sh scripts/check_bundle.sh [BUNDLE_DIR] [OUT_DIR]        (make bundle-check)
#
# Needs xvfb-run (Debian/Ubuntu: apt-get install xvfb xauth, and Qt's X11 libraries: packaging/README.md).
set -eu
BUNDLE=${1:-dist/specula}
OUT=${2:-build/bundle-check}
SIZE=${SIZE:-1024x700}
TIMEOUT=${TIMEOUT:-900}
EXE="$BUNDLE/specula-chat"
[ -x "$EXE" ] || { echo "check_bundle: no $EXE (make bundle first)" >&2; exit 1; }
command -v xvfb-run >/dev/null || { echo "check_bundle: xvfb-run is not installed (apt-get install xvfb xauth)" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HOME_DIR=$(mktemp -d)
trap 'rm -rf "$HOME_DIR"' EXIT
start=$(date +%s)
status=0
env -i PATH="/usr/bin:/bin" HOME="$HOME_DIR" LANG=C.UTF-8 \
    timeout "$TIMEOUT" xvfb-run -a -s "-screen 0 ${SIZE}x24" \
    "$EXE" --send "What is the capital of France? Answer in one sentence." --max-new-tokens 48 \
    --screenshot "$OUT/first-start.png" --exit-after-reply >"$OUT/stdout.txt" 2>"$OUT/stderr.txt" || status=$?
seconds=$(( $(date +%s) - start ))
{
    echo "exit status: $status"
    echo "seconds to the reply, fresh home: $seconds"
    echo "bundle size: $(du -sh "$BUNDLE" | cut -f1)"
    echo "largest parts:"
    du -s "$BUNDLE"/_internal/* 2>/dev/null | sort -rn | head -12 | awk '{printf "  %6d MB  %s\n", $1 / 1024, $2}'
} | tee "$OUT/summary.txt"
if [ "$status" -ne 0 ]; then
    echo "check_bundle: the bundle failed (status $status):" >&2
    tail -20 "$OUT/stderr.txt" >&2
    exit 1
fi
[ -s "$OUT/first-start.png" ] || { echo "check_bundle: no screenshot was saved" >&2; exit 1; }
echo "check_bundle: the bundle started, answered and saved $OUT/first-start.png"
