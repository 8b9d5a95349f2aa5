#!/usr/bin/env bash
# The PyTorch emulation of --fp8 on one GPU (docs/numerics.md, "the PyTorch emulation"): the d12 loss-parity
# setup of tests/gpu/test_fp8_parity.sh section 5 trained by scripts/train_gpt2.py, in bf16 and with the blocks'
# four linear layers in emulated FP8 (--fp8-emulate, scripts/fp8_emulate.py), six runs at once on the one GPU:
#   bf16               no emulation (the reference of the % column)
#   tensorwise         our --fp8 1 recipe: one current-amax scale per tensor, e4m3 x and W, e5m2 dY
#   tensorwise_ends2   the same with the first and last 2 blocks in bf16 (our --fp8-bf16-layers 2)
#   rowwise            one scale per token row of x / dY and per output (forward) or input (dX) channel of W
#   rowwise_gw_bf16    rowwise, the weight gradient unquantized (bf16)
#   blockwise          DeepSeek-V3's 1x128 activation/gradient tiles and 128x128 weight blocks
# Setup (as section 5, read off train_gpt2.cu's defaults): d12, seed 1337, B=4 T=128, STEPS (2000) steps,
# AdamW lr 3e-4 (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices and embeddings), cosine to 0 after
# 100 warmup steps, grad clip 1.0, a shuffled epoch order, val every 100 steps on the whole val split (63
# batches). What differs from our trainer: PyTorch's own init draws (same distributions, other numbers),
# another shuffle order, fp32 master weights whose bf16 copy autocast rounds to nearest (ours rounds it
# stochastically), PyTorch's bf16 kernels. So compare each recipe with this bf16 run, not with ours.
# The table: each run's final val loss (at STEPS), best val, both against bf16 in %, step-1 loss, median
# ms/step. PASS/FAIL only says that a run finished with a finite final val loss; the % are findings.
# Two sanity checks can fail: tensorwise's step-1 train loss within 1% of bf16's (same init, so the
# quantized forward is right), and bf16's final val loss below 6.0 (the setup trains).
# Data: data/tinyshakespeare/*_{train,val}.bin if present, else tokenized into $OUT/data by
# scripts/data/tinyshakespeare.py (offline: LLMC_OFFLINE_DATA holds tinyshakespeare.txt and gpt2.tiktoken).
# Env: OUT (default /tmp/out; logs in $OUT/fp8_emulate), STEPS (2000), BUDGET seconds for everything
# (default 360; every run is under a timeout of what is left), PYTHON (python3), COMPILE=1 (train through
# torch.compile; off by default: eager is the tested path), NAMES (the runs, default all six; bf16 and
# tensorwise are the sanity checks' pair). Runtime: eager PyTorch, CPU-bound by kernel
# launches: estimated 2-4 minutes for the six at once on an H200 (not yet measured). Needs torch with
# CUDA and float8 dtypes, and numpy; builds nothing.
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/out}/fp8_emulate
STEPS=${STEPS:-2000}
BUDGET=${BUDGET:-360}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
rows=(); bad=0
row() { rows+=("$(printf '%-4s %-18s %s' "$1" "$2" "$3")"); [ "$1" = FAIL ] && bad=$((bad + 1)); echo "$1 $2 $3"; }
finish() {
    echo "fp8_emulate: ${SECONDS}s of BUDGET ${BUDGET}s"
    printf '%s\n' "" "== fp8 emulation summary (logs in $OUT; % = relative to the bf16 run)" \
        "$(printf '%-4s %-18s %s' "" run "final val @$STEPS (vs bf16) | best val (vs bf16) | step-1 loss | ms/step | wall")" "${rows[@]}"
    [ $bad -eq 0 ] && echo "fp8_emulate: PASS" || echo "fp8_emulate: FAIL ($bad)"
    exit $((bad > 0))
}
left() { echo $((BUDGET - SECONDS > 1 ? BUDGET - SECONDS : 1)); }

if ! timeout 60 "$PY" -c "import numpy, torch; assert torch.cuda.is_available(), 'no GPU visible'; torch.float8_e4m3fn; print('torch', torch.__version__, torch.cuda.get_device_name())" > "$OUT/torch.log" 2>&1; then
    row FAIL "torch" "$PY cannot run the emulation: $(tail -n 1 "$OUT/torch.log")"; finish
fi
cat "$OUT/torch.log"

DATA=data/tinyshakespeare
if ! ls $DATA/*_train.bin >/dev/null 2>&1; then
    timeout 90 "$PY" scripts/data/tinyshakespeare.py --out-dir "$OUT/data" > "$OUT/data.log" 2>&1
    DATA=$OUT/data/tinyshakespeare
fi
if ! ls "$DATA"/*_train.bin >/dev/null 2>&1 || ! ls "$DATA"/*_val.bin >/dev/null 2>&1; then
    row FAIL "data" "tiny Shakespeare not tokenized: see $OUT/data.log: $(tail -n 1 "$OUT/data.log" 2>/dev/null)"; finish
fi

common=(--model d12 --seed 1337 --device cuda --dtype bf16 --batch 4 --seq 128 --steps "$STEPS"
        --lr 3e-4 --schedule cosine --warmup 100 --final-lr-frac 0 --beta1 0.9 --beta2 0.95 --eps 1e-8
        --weight-decay 0.1 --grad-clip 1.0 --shuffle 1 --val-every 100 --val-batches 63
        --train "$DATA/*_train.bin" --val "$DATA/*_val.bin")
[ "${COMPILE:-0}" = 1 ] && common+=(--compile)
names=(${NAMES:-bf16 tensorwise tensorwise_ends2 rowwise rowwise_gw_bf16 blockwise})  # NAMES: a subset (keep bf16, tensorwise)
declare -A flags=([bf16]="none" [tensorwise]="tensorwise" [tensorwise_ends2]="tensorwise --fp8-emulate-bf16-layers 2"
                  [rowwise]="rowwise" [rowwise_gw_bf16]="rowwise_gw_bf16" [blockwise]="blockwise")
t=$(( $(left) > 15 ? $(left) - 15 : 1 ))  # 15 s kept for the table
for name in "${names[@]}"; do
    # shellcheck disable=SC2086  # flags[] holds several words
    ( start=$SECONDS
      OMP_NUM_THREADS=2 timeout "$t" "$PY" scripts/train_gpt2.py "${common[@]}" --log "$OUT/$name.log" \
          --fp8-emulate ${flags[$name]} > "$OUT/$name.out" 2>&1
      echo "$? $((SECONDS - start))" > "$OUT/$name.rc" ) &
done
wait

val_at() { awk -v s="$2" '$1 == "step" && $2 == s && $3 == "val_loss" { v = $4 } END { print v }' "$1" 2>/dev/null; }
best_val() { awk '$1 == "step" && $3 == "val_loss" { if (b == "" || $4 < b) b = $4 } END { print b }' "$1" 2>/dev/null; }
last_val() { awk '$1 == "step" && $3 == "val_loss" { v = "step " $2 " val " $4 } END { print v }' "$1" 2>/dev/null; }
step1() { awk '$1 == "step" && $2 == 1 && $3 == "train_loss" { print $4; exit }' "$1" 2>/dev/null; }
median_ms() { awk '$1 == "step" && $3 == "train_loss" && $2 > 10 { for (i = 5; i < NF; i++) if ($i == "ms") print $(i + 1) }' "$1" 2>/dev/null |
              sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "n/a"; else printf "%+.2f%%", 100 * (a - b) / b }'; }
finite() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]]; }  # the trainer prints %.6f: nan and inf fail

base=$(val_at "$OUT/bf16.log" "$STEPS"); base_best=$(best_val "$OUT/bf16.log")
for name in "${names[@]}"; do
    log=$OUT/$name.log
    rc=""; wall=""; [ -f "$OUT/$name.rc" ] && read -r rc wall < "$OUT/$name.rc"
    v=$(val_at "$log" "$STEPS"); b=$(best_val "$log")
    figs="${v:-none} ($(pct "$v" "$base")) | ${b:-none} ($(pct "$b" "$base_best")) | $(step1 "$log") | $(median_ms "$log") | ${wall:-?}s"
    if [ "$rc" = 0 ] && finite "$v"; then row PASS "$name" "$figs"
    else row FAIL "$name" "$figs; rc ${rc:-?} (124: timeout), got to: $(last_val "$log"); $(tail -n 1 "$OUT/$name.out" 2>/dev/null)"; fi
done

a=$(step1 "$OUT/tensorwise.log"); b=$(step1 "$OUT/bf16.log")
if awk -v a="$a" -v b="$b" 'BEGIN { exit !(a != "" && b != "" && (a - b) / b <= 0.01 && (b - a) / b <= 0.01) }'; then
    row PASS "sanity" "tensorwise step-1 loss $a within 1% of bf16's $b"
else row FAIL "sanity" "tensorwise step-1 loss ${a:-none} not within 1% of bf16's ${b:-none}"; fi
if awk -v v="$base" 'BEGIN { exit !(v != "" && v + 0 < 6.0) }'; then row PASS "sanity" "bf16 final val $base below 6.0"
else row FAIL "sanity" "bf16 final val ${base:-none} not below 6.0"; fi
finish
