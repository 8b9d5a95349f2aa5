# decode_common.sh: what the decode step's GPU scripts share (tests/decode_latency_gpu.sh,
# tests/decode_sync_gpu.sh), sourced by them from the repo root after they set OUT and ALL_PARTS:
#   LAB, GEN          the lab binaries' folder (LAB_BUILD, default dev/cuda/build) and the generate
#                     binary (GEN, default build/generate)
#   need BIN...       exits 1 unless every BIN is built, pointing at the caller's build list
#   want N            whether part N runs: PARTS="3 4" (say) runs only those, default ALL_PARTS
#   part NAME STATUS  records "PASS  NAME" or "FAIL  NAME (rc STATUS)" for the summary
#   ran FILE          whether a summary's input is there (from a part this run ran)
#   summary NAME      the PASS/FAIL lines under "==== NAME summary", the seconds since sourcing and
#                     OUT; returns 1 if any part failed (the caller's last command, its exit status)
LAB=${LAB_BUILD:-dev/cuda/build}
GEN=${GEN:-build/generate}
parts=(); bad=0
t0=$SECONDS
need() {
    local b
    for b in "$@"; do
        [ -x "$b" ] || { echo "error: $b is missing (build it first: see the top of $0)"; exit 1; }
    done
}
want() { [[ " ${PARTS:-$ALL_PARTS} " == *" $1 "* ]]; }
part() {
    if [ "$2" -eq 0 ]; then parts+=("PASS  $1"); else parts+=("FAIL  $1 (rc $2)"); bad=1; fi
}
ran() { [ -s "$1" ] || { echo "  (not run: PARTS)"; return 1; }; }
summary() {
    echo "==== $1 summary ($((SECONDS - t0)) s, logs in $OUT)"
    for p in "${parts[@]}"; do echo "$p"; done
    [ $bad -eq 0 ]
}
