# Sourced by the GPU-against-CPU trainer suites (test_loss_mask_gpu.sh, test_doc_mask_gpu.sh): their
# counters and comparisons. The caller sets tmp (a work folder), MODEL (arch -> --init spec) and COMMON
# (the flags of every run).
passed=0; failed=0
pass() { passed=$((passed + 1)); echo "ok   $1${2:+: $2}"; }
flunk() { failed=$((failed + 1)); echo "FAIL $1: $2"; }

# train NAME BIN ARCH SHARD VAL [FLAGS...]: a run, its log in $tmp/NAME.log, its output in $tmp/NAME.out,
# its final checkpoint under $tmp/NAME/
train() {
    local name=$1 bin=$2 arch=$3 shard=$4 val=$5 rc; shift 5
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} "$bin" --init "${MODEL[$arch]}" --train "$tmp/$shard" --val "$tmp/$val" \
        "${COMMON[@]}" --log "$tmp/$name.log" --out-dir "$tmp/$name" "$@" >"$tmp/$name.out" 2>&1
    rc=$?
    [ $rc = 0 ] && return 0
    flunk "$name" "exit status $rc: $(grep -m 1 -iE 'error|fail' "$tmp/$name.out")"; return 1
}
# close WHAT A B RTOL: the losses of runs A and B within RTOL relative
close() {
    local got
    if got=$(python3 tests/gpu/test_loss_mask_gpu.py compare "$tmp/$2.log" "$tmp/$3.log" "$4"); then pass "$1" "$got"
    else flunk "$1" "$got"; fi
}
# same WHAT A B: the step and val lines of runs A and B bit for bit, and their final model.bin
steplines() { awk '$1 == "step" && ($3 == "train_loss" || $3 == "val_loss") { print $2, $3, $4, $5, $6, $7, $8 }' "$1" |
              sed 's/ ms .*//'; }
same() {
    if [ -z "$(steplines "$tmp/$2.log")" ]; then flunk "$1" "no step lines"
    elif ! diff <(steplines "$tmp/$2.log") <(steplines "$tmp/$3.log") >"$tmp/$3.diff"; then
        flunk "$1" "the step lines differ: $(head -n 4 "$tmp/$3.diff" | tr '\n' ' ')"
    elif ! cmp -s "$tmp/$2/step_00000004/model.bin" "$tmp/$3/step_00000004/model.bin"; then
        flunk "$1" "the final model.bin differ"
    else pass "$1" "bit for bit, last train loss $(steplines "$tmp/$3.log" | awk '$2 == "train_loss"' | tail -n 1 | cut -d' ' -f3)"
    fi
}
