#!/usr/bin/env bash
# Bad inputs give one clear line, never a crash or a silent read: runs build/train_gpt2_cpu and
# build/test_gpt2_cpu (built by `make`; this script builds nothing) on corrupt files made in a
# temp dir and on bad flag values, and build/train_gpt2cu / test_gpt2cu, where built, on models
# they must refuse before touching a GPU. Each case must exit with status 1 and print exactly one stderr
# line `error: ...` that names the file or flag at fault. A control case with the same files
# uncorrupted must succeed, so the failures are caused by the corruption and nothing else.
# Prints one line per case; exits non-zero if any case misbehaves.
cd "$(dirname "$0")/../.." || exit 1
TRAIN=${TRAIN:-build/train_gpt2_cpu}  # overridable, to show a case failing on an older build
TEST=build/test_gpt2_cpu
for b in $TRAIN $TEST; do
    [ -x "$b" ] || { echo "test_bad_inputs: $b is missing, run make first"; exit 1; }
done
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A tiny valid model (V = Vp = 64, maxT 16, L 1, C 8, 2 heads), a token shard, a tokenizer, and
# corrupt variants of each, written through the project's Python format code.
python3 - "$tmp" <<'EOF' || { echo "test_bad_inputs: could not create the test files"; exit 1; }
import sys, shutil
import numpy as np
sys.path.insert(0, "scripts")
import llmc_formats as fmt
d = sys.argv[1]
cfg = dict(max_seq_len=16, vocab_size=64, padded_vocab_size=64, num_layers=1, num_heads=2,
           num_kv_heads=2, channels=8, window=0)
rng = np.random.default_rng(0)
fmt.write_model(f"{d}/good.bin", cfg, rng.normal(0, 0.02, fmt.num_params(cfg)).astype(np.float32))
llama = dict(cfg, architecture=fmt.ARCH_LLAMA, norm=fmt.NORM_RMSNORM, norm_eps=1e-5, position=fmt.POS_ROPE,
             rope_theta=10000.0, mlp=fmt.MLP_SWIGLU, mlp_hidden=24, biases=0, tied_head=0)
fmt.write_model(f"{d}/llama.bin", llama, rng.normal(0, 0.02, fmt.num_params(llama)).astype(np.float32))
qwen2 = dict(llama, qkv_bias=1)  # q/k/v biases only: a version-4 file
fmt.write_model(f"{d}/qwen2.bin", qwen2, rng.normal(0, 0.02, fmt.num_params(qwen2)).astype(np.float32))
fmt.write_shard(f"{d}/train.bin", rng.integers(0, 64, 2000), 64)
fmt.write_shard(f"{d}/bigids.bin", rng.integers(0, 1000, 2000), 50257)  # ids the 64-token model can't take
fmt.write_shard(f"{d}/gpt2vocab.bin", rng.integers(0, 64, 2000), 50257)  # for the dN models (GPT-2's vocab)
# shards of other tokenizers than the 64-token model's: a smaller vocabulary (ids that fit the model
# but mean other tokens), and one of vocab 100 in the same folder as one of 64 (two tokenizers)
fmt.write_shard(f"{d}/vocab32.bin", rng.integers(0, 32, 2000), 32)
import os
os.makedirs(f"{d}/mixed")
fmt.write_shard(f"{d}/mixed/a_000.bin", rng.integers(0, 64, 2000), 64)
fmt.write_shard(f"{d}/mixed/a_001.bin", rng.integers(0, 64, 2000), 100)
# two shards of one pattern, the second holding one id past the 64-token vocabulary (written good, then patched)
os.makedirs(f"{d}/twoshards")
fmt.write_shard(f"{d}/twoshards/a_000.bin", rng.integers(0, 64, 2000), 64)
fmt.write_shard(f"{d}/twoshards/a_001.bin", rng.integers(0, 64, 2000), 64)
with open(f"{d}/twoshards/a_001.bin", "r+b") as f:
    f.seek(1024 + 2 * 1500)
    f.write(np.array([64], "<u2").tobytes())
# loss-masked shards (version 3): a good one, its mask cut short, a mask value of 2, a version this
# build does not know, and a pattern mixing a masked shard with an unmasked one
fmt.write_shard(f"{d}/masked.bin", rng.integers(0, 64, 2000), 64, mask=rng.integers(0, 2, 2000))
masked = open(f"{d}/masked.bin", "rb").read()
open(f"{d}/masktrunc.bin", "wb").write(masked[:-100])
bad = bytearray(masked)
bad[1024 + 2 * 2000 + 700] = 2
open(f"{d}/maskvalue.bin", "wb").write(bytes(bad))
bad = bytearray(masked)
bad[8] = 4
open(f"{d}/shardv4.bin", "wb").write(bytes(bad))
os.makedirs(f"{d}/maskmix")
shutil.copy(f"{d}/masked.bin", f"{d}/maskmix/a_000.bin")
shutil.copy(f"{d}/train.bin", f"{d}/maskmix/a_001.bin")
fmt.write_tokenizer(f"{d}/tok.bin", [bytes([65 + i % 26]) for i in range(64)], 63)
fmt.write_tokenizer(f"{d}/tok32.bin", [bytes([65 + i % 26]) for i in range(32)], 31)  # smaller than the model's 64
good = open(f"{d}/good.bin", "rb").read()
def patched(name, slot, value, src=good):
    h = np.frombuffer(src[:1024], dtype="<i8").copy()
    h[slot] = value
    open(f"{d}/{name}", "wb").write(h.tobytes() + src[1024:])
patched("badmagic.bin", 0, fmt.fourcc("ABCD"))
patched("badversion.bin", 1, 99)
patched("badkvheads.bin", 8, 3)  # 3 key/value heads for 2 query heads
patched("badcount.bin", 11, 12345)
llama_good = open(f"{d}/llama.bin", "rb").read()
patched("badnorm.bin", 13, 2, llama_good)  # a norm kind that does not exist
patched("badtheta.bin", 16, np.float64(0.5).view(np.int64), llama_good)  # RoPE theta <= 1
patched("badqkvbias.bin", 26, 2, open(f"{d}/qwen2.bin", "rb").read())  # qkv_bias neither 0 nor 1
open(f"{d}/truncated.bin", "wb").write(good[:-10])
open(f"{d}/extra.bin", "wb").write(good + b"\0\0\0\0")
open(f"{d}/short.bin", "wb").write(good[:100])
open(f"{d}/empty.bin", "wb").close()
# non-finite weights: a NaN in wte, an inf in a LayerNorm weight; and finite weights that overflow
# in the first step (lnfw = 3e38: the logits overflow, the loss is NaN)
params = rng.normal(0, 0.02, fmt.num_params(cfg)).astype(np.float32)
for name, tensor, value in (("nan.bin", "wte", np.nan), ("inf.bin", "ln1w", np.inf), ("diverges.bin", "lnfw", 3e38)):
    p = params.copy()
    fmt.split_params(cfg, p)[tensor].flat[3] = value
    if name == "diverges.bin":
        fmt.split_params(cfg, p)[tensor][:] = value
    fmt.write_model(f"{d}/{name}", cfg, p)
open(f"{d}/old.log", "w").write("step 1 train_loss 4.0 lr 1e-3 ms 1.0 tok_s 1.0\n")
tok = open(f"{d}/tok.bin", "rb").read()
open(f"{d}/tok_truncated.bin", "wb").write(tok[:-3])
dbg = open("tests/fixture/debug.bin", "rb").read()
open(f"{d}/debug_truncated.bin", "wb").write(dbg[:len(dbg) // 2])
# checkpoints for --resume (DONE as earlier builds wrote it, so only the readers check them): one
# whose state.bin is cut short, one whose state is for another model, one with a NaN in AdamW's v
for name in ("ckpt_trunc", "ckpt_wrongstate", "ckpt_nanstate"):
    import os
    os.makedirs(f"{d}/{name}/step_00000001")
    shutil.copy(f"{d}/good.bin", f"{d}/{name}/step_00000001/model.bin")
    open(f"{d}/{name}/step_00000001/DONE", "w").write("ok\n")
n = fmt.num_params(cfg)
state = fmt.make_header(fmt.MAGIC_STATE, {2: 1, 3: n}).tobytes() + np.zeros(2 * n, np.float32).tobytes()
open(f"{d}/ckpt_trunc/step_00000001/state.bin", "wb").write(state[:-8])
state = fmt.make_header(fmt.MAGIC_STATE, {2: 1, 3: n + 1}).tobytes() + np.zeros(2 * (n + 1), np.float32).tobytes()
open(f"{d}/ckpt_wrongstate/step_00000001/state.bin", "wb").write(state)
v = np.zeros(n, np.float32)
v[7] = np.nan
fmt.write_state(f"{d}/ckpt_nanstate/step_00000001/state.bin", 1, np.zeros(n, np.float32), v)
os.makedirs(f"{d}/ckpt_none/step_00000005")  # no DONE: an interrupted save
EOF

T=$tmp
ok=0; bad=0
# expect_error NAME WANT CMD...: CMD must exit 1 with exactly one stderr line "error: ..." containing WANT
expect_error() {
    local name=$1 want=$2; shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$? lines msg
    lines=$(wc -l <"$tmp/err")
    msg=$(head -c 300 "$tmp/err" | head -n 1)
    if [ $rc -eq 1 ] && [ "$lines" -eq 1 ] && [[ $msg == "error: "* ]] && [[ $msg == *"$want"* ]]; then
        ok=$((ok + 1)); echo "ok   $name: $msg"
    else
        bad=$((bad + 1)); echo "BAD  $name: exit $rc, $lines stderr lines, wanted one 'error: ...$want...', got: $msg"
    fi
}
# expect_startup_error NAME WANT CMD...: as expect_error, and no training step ran before the error
expect_startup_error() {
    expect_error "$@"
    if grep -q "train_loss" "$tmp/out"; then
        bad=$((bad + 1)); echo "BAD  $1: the error came after training had started"
    fi
}
expect_success() {
    local name=$1; shift
    if "$@" >"$tmp/out" 2>"$tmp/err"; then ok=$((ok + 1)); echo "ok   $name: runs"
    else bad=$((bad + 1)); echo "BAD  $name: exit $?: $(head -n 1 "$tmp/err")"; fi
}

BASE=(--train "$T/train.bin" --batch 2 --seq 8 --steps 1 --val-every 0)
expect_success "control: the uncorrupted files train" $TRAIN "${BASE[@]}" --init "$T/good.bin" --tokenizer "$T/tok.bin" \
    --sample-every 1 --gen-tokens 4 --out-dir "$T/ckpt_ok"
expect_success "control: resume from that checkpoint" $TRAIN "${BASE[@]}" --steps 2 --resume "$T/ckpt_ok"

# model files given to --init
expect_error "missing model file" "$T/nope.bin" $TRAIN "${BASE[@]}" --init "$T/nope.bin"
expect_error "zero-length model file" "$T/empty.bin" $TRAIN "${BASE[@]}" --init "$T/empty.bin"
expect_error "model shorter than a header" "$T/short.bin" $TRAIN "${BASE[@]}" --init "$T/short.bin"
expect_error "truncated model" "$T/truncated.bin" $TRAIN "${BASE[@]}" --init "$T/truncated.bin"
expect_error "model with extra bytes" "$T/extra.bin" $TRAIN "${BASE[@]}" --init "$T/extra.bin"
expect_error "wrong magic" "$T/badmagic.bin" $TRAIN "${BASE[@]}" --init "$T/badmagic.bin"
expect_error "wrong version" "$T/badversion.bin" $TRAIN "${BASE[@]}" --init "$T/badversion.bin"
expect_error "token shard passed as a model" "token shard" $TRAIN "${BASE[@]}" --init "$T/train.bin"
expect_error "parameter count disagrees with shape" "$T/badcount.bin" $TRAIN "${BASE[@]}" --init "$T/badcount.bin"
expect_error "num_kv_heads not dividing num_heads" "$T/badkvheads.bin" $TRAIN "${BASE[@]}" --init "$T/badkvheads.bin"
expect_error "not a descriptor nor a file" "--init" $TRAIN "${BASE[@]}" --init "x12"
expect_error "model with a NaN weight" "$T/nan.bin" $TRAIN "${BASE[@]}" --init "$T/nan.bin"
expect_error "model with an inf weight" "$T/inf.bin" $TRAIN "${BASE[@]}" --init "$T/inf.bin"
expect_error "a loss that turns NaN stops the run" "step 1: the loss is" $TRAIN "${BASE[@]}" --init "$T/diverges.bin"

# grouped-query attention and a window: the flags shape a fresh model; a file keeps its own values.
# The control samples more tokens than --seq and the window: the sample's KV cache is a ring of 3 slots.
GQA=(--init d2 --kv-heads 1 --window 3 --train "$T/gpt2vocab.bin")
expect_success "control: fresh GQA + window model trains and samples" $TRAIN "${BASE[@]}" "${GQA[@]}" \
    --sample-every 1 --gen-tokens 12 --out-dir "$T/ckpt_gqa"
expect_success "control: resume it, repeating its flags" $TRAIN "${BASE[@]}" --steps 2 "${GQA[@]}" --resume "$T/ckpt_gqa"
expect_error "--kv-heads not dividing the heads" "--kv-heads 3" $TRAIN "${BASE[@]}" --init d2 --kv-heads 3
expect_error "--window -1" "--window" $TRAIN "${BASE[@]}" --init d2 --window -1
expect_error "--kv-heads differing from the model file" "$T/good.bin has num_kv_heads 2" $TRAIN "${BASE[@]}" \
    --init "$T/good.bin" --kv-heads 1
expect_error "--window differing from the checkpoint" "has window 3" $TRAIN "${BASE[@]}" --steps 2 --resume "$T/ckpt_gqa" --window 4
# Llama-style models: the descriptor, --max-seq, version-2 model files with bad family fields. One
# thread: these tiny runs take milliseconds that way, seconds with two threads on a busy machine.
TRAIN1=(env OMP_NUM_THREADS=1 $TRAIN)
LLAMA=(--init llama:L1,C8,H2,KV1,F24,V64,untied --max-seq 16)
expect_success "control: fresh Llama model trains, samples past --seq to the context end and checkpoints" \
    "${TRAIN1[@]}" "${BASE[@]}" "${LLAMA[@]}" --sample-every 1 --gen-tokens 16 --out-dir "$T/ckpt_llama"
expect_startup_error "--gen-tokens past the context" "--gen-tokens 17: the trainer's samples end at the context" \
    "${TRAIN1[@]}" "${BASE[@]}" "${LLAMA[@]}" --sample-every 1 --gen-tokens 17
expect_success "control: resume it" "${TRAIN1[@]}" "${BASE[@]}" --steps 2 --resume "$T/ckpt_llama"
expect_success "control: a Llama model file trains" "${TRAIN1[@]}" "${BASE[@]}" --init "$T/llama.bin"
expect_error "llama descriptor without C and H" "L, C and H are required" "${TRAIN1[@]}" "${BASE[@]}" --init llama:L1
expect_error "llama descriptor with an unknown item" "'Q3' is not an item" "${TRAIN1[@]}" "${BASE[@]}" --init llama:L1,C8,H2,Q3
expect_error "llama descriptor with an odd head dim" "llama:L1,C6,H2,V64: RoPE needs an even head dim (channels / heads), got 3" \
    "${TRAIN1[@]}" "${BASE[@]}" --init llama:L1,C6,H2,V64
expect_error "llama descriptor with theta -5 (only theta named)" "llama:L1,C64,H2,V64,theta-5: RoPE needs theta in (1, 1e12), got -5" \
    "${TRAIN1[@]}" "${BASE[@]}" --init llama:L1,C64,H2,V64,theta-5
expect_error "--max-seq 0" "--max-seq" "${TRAIN1[@]}" "${BASE[@]}" "${LLAMA[@]}" --max-seq 0
expect_error "--max-seq differing from the model file" "$T/llama.bin has max_seq_len 16" "${TRAIN1[@]}" "${BASE[@]}" \
    --init "$T/llama.bin" --max-seq 32
expect_error "--init of another architecture with --resume" "differs from the model of the checkpoint" "${TRAIN1[@]}" \
    "${BASE[@]}" --steps 3 --resume "$T/ckpt_llama" --init llama:L1,C8,H2,KV1,F24,V64
# every descriptor field is compared on --resume, one left out by its default (KV's is H = 2, not 1)
expect_success "control: --resume with --init repeating the run's descriptor" "${TRAIN1[@]}" "${BASE[@]}" --steps 3 \
    --resume "$T/ckpt_llama" --init llama:L1,C8,H2,KV1,F24,V64,untied
expect_error "--init of another KV count with --resume" "differs from the model of the checkpoint" "${TRAIN1[@]}" \
    "${BASE[@]}" --steps 4 --resume "$T/ckpt_llama" --init llama:L1,C8,H2,KV2,F24,V64,untied
expect_error "--init leaving out a KV count that is not the default, with --resume" \
    "differs from the model of the checkpoint" "${TRAIN1[@]}" "${BASE[@]}" --steps 4 --resume "$T/ckpt_llama" \
    --init llama:L1,C8,H2,F24,V64,untied
expect_error "llama descriptor with a repeated key" "llama:L1,L2,C8,H2,V64: L is given twice" "${TRAIN1[@]}" \
    "${BASE[@]}" --init llama:L1,L2,C8,H2,V64
expect_error "llama descriptor with untied twice" "untied is given twice" "${TRAIN1[@]}" "${BASE[@]}" \
    --init llama:L1,C8,H2,V64,untied,untied
expect_error "model file with an unknown norm" "$T/badnorm.bin: header field norm" "${TRAIN1[@]}" "${BASE[@]}" --init "$T/badnorm.bin"
expect_error "model file with RoPE theta 0.5" "$T/badtheta.bin: RoPE needs theta" "${TRAIN1[@]}" "${BASE[@]}" --init "$T/badtheta.bin"
expect_success "control: a Qwen2-style model file (q/k/v biases only) trains" "${TRAIN1[@]}" "${BASE[@]}" \
    --init "$T/qwen2.bin"
expect_error "model file with qkv_bias 2" "$T/badqkvbias.bin: header field qkv_bias = 2 is out of range [0, 1]" \
    "${TRAIN1[@]}" "${BASE[@]}" --init "$T/badqkvbias.bin"
# the GPU trainer checks the attention flags before it touches a device (so these run without a GPU)
# the newer of the full build and make test's (flag checks only), so a stale one is not what is checked
GPU=build/train_gpt2cu
[ -x build/check/train_gpt2cu ] && { [ ! -x $GPU ] || [ build/check/train_gpt2cu -nt $GPU ]; } && GPU=build/check/train_gpt2cu
if [ -x $GPU ]; then
    expect_error "GPU trainer: a Llama descriptor of head size 4" "head size 4 (channels / heads) must be 64 or 128" \
        $GPU "${BASE[@]}" "${LLAMA[@]}"
    expect_error "GPU trainer: a Llama model file of head size 4" "head size 4 (channels / heads) must be 64 or 128" \
        $GPU "${BASE[@]}" --init "$T/llama.bin"
    expect_error "GPU trainer: a SwiGLU width not a multiple of 8" "MLP hidden width 132 must be a multiple of 8" \
        $GPU "${BASE[@]}" --init llama:L1,C128,H2,F132,V64
    expect_error "GPU trainer: --kv-heads not dividing the heads" "--kv-heads 3" $GPU "${BASE[@]}" --init d2 --kv-heads 3
    expect_error "GPU trainer: --window -1" "--window" $GPU "${BASE[@]}" --init d2 --window -1
    expect_error "GPU trainer: --deterministic 2" "--deterministic" $GPU "${BASE[@]}" --init d2 --deterministic 2
    expect_error "GPU trainer: --graph 2" "--graph: must be in" $GPU "${BASE[@]}" --init d2 --graph 2
    expect_error "GPU trainer: --matmul-autotune 2" "--matmul-autotune: must be in" $GPU "${BASE[@]}" --init d2 \
        --matmul-autotune 2
    expect_error "GPU trainer: --matmul-autotune 1 with --deterministic 1" "not with --deterministic 1" $GPU "${BASE[@]}" \
        --init d2 --matmul-autotune 1 --deterministic 1
    expect_error "GPU trainer: --fp8-linears with an unknown layer" "--fp8-linears: unknown linear layer 'proj'" \
        $GPU "${BASE[@]}" --init d2 --fp8 1 --fp8-linears qkv,proj
    expect_error "GPU trainer: --fp8-bf16-layers without --fp8 1" "only with --fp8 1" $GPU "${BASE[@]}" --init d2 \
        --fp8-bf16-layers 1
    expect_error "GPU trainer: --fp8-head without --fp8 1" "only with --fp8 1" $GPU "${BASE[@]}" --init d2 --fp8-head 1
    expect_error "GPU trainer: --fp8-head 2" "--fp8-head: must be in" $GPU "${BASE[@]}" --init d2 --fp8 1 --fp8-head 2
    expect_error "GPU trainer: --fp8 1 with B*T not a multiple of 64" "--fp8 1: batch * seq = 100 must be a multiple of 64" \
        $GPU "${BASE[@]}" --init d2 --fp8 1 --batch 1 --seq 100
    expect_error "GPU trainer: --fp8 1 with a SwiGLU width not a multiple of 64" "--fp8 1: MLP hidden width 2080 must be a multiple of 64" \
        $GPU "${BASE[@]}" --init llama:L1,C128,H2,F2080,V64 --fp8 1 --batch 1 --seq 64
    expect_error "GPU trainer: --fp8-wgrad with an unknown precision" "--fp8-wgrad: unknown precision 'fp16'" \
        $GPU "${BASE[@]}" --init d2 --fp8 1 --fp8-wgrad fp16
    expect_error "GPU trainer: --fp8-wgrad without --fp8 1" "only with --fp8 1" $GPU "${BASE[@]}" --init d2 --fp8-wgrad bf16
    expect_error "GPU trainer: --fp8-scaling rowwise with a layer wider than 4096" \
        "--fp8-scaling rowwise: fc width 8320 is above 4096" \
        $GPU "${BASE[@]}" --init llama:L1,C128,H2,F4160,V64 --fp8 1 --fp8-scaling rowwise --batch 1 --seq 64
    [ -x build/train_gpt2cu_fp32 ] && expect_error "GPU trainer, fp32 build: --fp8 1" "--fp8 1: the FP8 matmuls write bf16" \
        build/train_gpt2cu_fp32 "${BASE[@]}" --init d2 --fp8 1 --batch 1 --seq 64
    expect_error "GPU trainer: --window differing from the checkpoint" "has window 3" $GPU "${BASE[@]}" --steps 2 \
        --resume "$T/ckpt_gqa" --window 4
    # and the flags and run files (open_run_files runs before the device starts)
    expect_error "GPU trainer: a flag as a flag's value" "--out-dir: missing value" $GPU "${BASE[@]}" --out-dir --log x
    expect_error "GPU trainer: --steps 0" "--steps" $GPU "${BASE[@]}" --steps 0
    expect_error "GPU trainer: --total-batch overflow" "--total-batch" $GPU "${BASE[@]}" --total-batch 68719476736
    expect_error "GPU trainer: --init of another shape with --resume" "--init d3" $GPU "${BASE[@]}" --steps 3 \
        --resume "$T/ckpt_gqa" --init d3
    expect_error "GPU trainer: --log below a file" "--log $T/good.bin" $GPU "${BASE[@]}" --log "$T/good.bin/log.txt"
    expect_error "GPU trainer: a fresh run into another run's --out-dir" "--out-dir $T/ckpt_gqa" $GPU "${BASE[@]}" \
        --init d2 --out-dir "$T/ckpt_gqa"
fi

# data, tokenizer, checkpoints
expect_error "--train matches nothing" "$T/none_*.bin" $TRAIN "${BASE[@]}" --init "$T/good.bin" --train "$T/none_*.bin"
expect_startup_error "a --tokenizer smaller than the model's vocabulary" \
    "--tokenizer $T/tok32.bin: 32 tokens, the model's vocabulary has 64" $TRAIN "${BASE[@]}" --init "$T/good.bin" \
    --tokenizer "$T/tok32.bin" --sample-every 1 --gen-tokens 4
if [ -x $GPU ] && nvidia-smi -L >/dev/null 2>&1; then  # checked after the device starts, before any step
    expect_startup_error "GPU trainer: a --tokenizer smaller than the model's vocabulary" \
        "--tokenizer $T/tok32.bin: 32 tokens, the model's vocabulary has 50257" $GPU "${BASE[@]}" --init d1 \
        --data-vocab 64 --tokenizer "$T/tok32.bin" --sample-every 1 --gen-tokens 4
fi
expect_error "shards of a larger vocabulary than the model's" \
    "$T/bigids.bin: written by a tokenizer of vocab_size 50257 (its header), larger than the model's vocab_size 64" \
    $TRAIN "${BASE[@]}" --init "$T/good.bin" --train "$T/bigids.bin"
# the shard header's vocab_size must be the model's, so another tokenizer's data is refused even
# when all its ids fit the model; --data-vocab names a smaller one (a model that pads its tokenizer's)
expect_startup_error "shards of a smaller vocabulary than the model's" \
    "$T/vocab32.bin: written by a tokenizer of vocab_size 32 (its header), the model's vocab_size is 64" \
    $TRAIN "${BASE[@]}" --init "$T/good.bin" --train "$T/vocab32.bin"
expect_startup_error "--val shards of another vocabulary than the model's" "$T/vocab32.bin: written by a tokenizer of vocab_size 32" \
    $TRAIN "${BASE[@]}" --init "$T/good.bin" --val "$T/vocab32.bin"
expect_startup_error "shards of two vocabularies in one --train pattern" \
    "$T/mixed/a_001.bin: vocab_size 100 in its header, but $T/mixed/a_000.bin (matched by the same pattern" \
    $TRAIN "${BASE[@]}" --init "$T/good.bin" --train "$T/mixed/a_*.bin"
expect_startup_error "a bad token id in the second shard of --train, found at start" \
    "$T/twoshards/a_001.bin: token id 64 at token offset 1500 is >= vocab_size 64" \
    $TRAIN "${BASE[@]}" --init "$T/good.bin" --train "$T/twoshards/a_*.bin"
expect_success "control: a shard with a loss mask trains" $TRAIN "${BASE[@]}" --init "$T/good.bin" --train "$T/masked.bin" \
    --val "$T/masked.bin" --val-every 1
expect_startup_error "a loss mask cut short" "$T/masktrunc.bin: truncated" $TRAIN "${BASE[@]}" --init "$T/good.bin" \
    --train "$T/masktrunc.bin"
expect_startup_error "a loss mask value of 2" "$T/maskvalue.bin: loss mask value 2 at token offset 700 is not 0 or 1" \
    $TRAIN "${BASE[@]}" --init "$T/good.bin" --train "$T/maskvalue.bin"
expect_startup_error "a shard version this build does not know" "$T/shardv4.bin: unsupported version 4 of a token shard" \
    $TRAIN "${BASE[@]}" --init "$T/good.bin" --train "$T/shardv4.bin"
expect_startup_error "masked and unmasked shards in one --train pattern" \
    "$T/maskmix/a_001.bin: has no loss mask, but $T/maskmix/a_000.bin (matched by the same pattern" \
    $TRAIN "${BASE[@]}" --init "$T/good.bin" --train "$T/maskmix/a_*.bin"
if [ -x $GPU ]; then  # refused before the device starts, so this runs without a GPU
    expect_startup_error "GPU trainer: --fp8-head 1 with a loss-masked --train shard" \
        "--fp8-head 1: $T/masked.bin has a loss mask" $GPU "${BASE[@]}" --init d2 --train "$T/masked.bin" --fp8 1 \
        --fp8-head 1
fi
expect_success "control: --data-vocab 32 takes the smaller vocabulary's shards" $TRAIN "${BASE[@]}" --init "$T/good.bin" \
    --train "$T/vocab32.bin" --data-vocab 32
expect_startup_error "--data-vocab of a shard's, but another --val" "$T/train.bin: written by a tokenizer of vocab_size 64 (its header), but --data-vocab is 32" \
    $TRAIN "${BASE[@]}" --init "$T/good.bin" --train "$T/vocab32.bin" --data-vocab 32 --val "$T/train.bin"
expect_error "--data-vocab above the model's" "--data-vocab 65: above the model's vocab_size 64" \
    $TRAIN "${BASE[@]}" --init "$T/good.bin" --data-vocab 65
expect_error "model file passed as --train" "$T/good.bin" $TRAIN "${BASE[@]}" --init "$T/good.bin" --train "$T/good.bin"
expect_error "truncated tokenizer" "$T/tok_truncated.bin" $TRAIN "${BASE[@]}" --init "$T/good.bin" --tokenizer "$T/tok_truncated.bin"
expect_error "--resume dir without a checkpoint" "--resume" $TRAIN "${BASE[@]}" --resume "$T/ckpt_none"
expect_error "--resume dir missing" "--resume" $TRAIN "${BASE[@]}" --resume "$T/no_such_dir"
expect_error "truncated state.bin" "state.bin" $TRAIN "${BASE[@]}" --resume "$T/ckpt_trunc"
expect_error "state.bin of another model" "state.bin" $TRAIN "${BASE[@]}" --resume "$T/ckpt_wrongstate"
expect_error "state.bin with a NaN moment" "state.bin" $TRAIN "${BASE[@]}" --resume "$T/ckpt_nanstate"
expect_error "--resume with --steps below the checkpoint's" "--steps 1" $TRAIN "${BASE[@]}" --resume "$T/ckpt_ok"
expect_error "--init of another shape with --resume" "--init d2" $TRAIN "${BASE[@]}" --steps 3 --resume "$T/ckpt_ok" --init d2
expect_startup_error "a fresh run into another run's --out-dir" "--out-dir $T/ckpt_ok" $TRAIN "${BASE[@]}" \
    --init "$T/good.bin" --out-dir "$T/ckpt_ok"

# --init of a checkpoint: a step directory means its model.bin (weights only, a fresh optimizer),
# verified against DONE, as is a model.bin named directly; a directory of checkpoints is refused
# (--resume continues a run). ckpt_dmg: ckpt_ok's step 1 with a bit of model.bin flipped after DONE.
mkdir -p "$T/ckpt_dmg" && cp -r "$T/ckpt_ok/step_00000001" "$T/ckpt_dmg/"
python3 -c "import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); b[1100] ^= 1; open(p, 'wb').write(b)" \
    "$T/ckpt_dmg/step_00000001/model.bin"
expect_success "control: --init of a checkpoint directory trains from its weights" $TRAIN "${BASE[@]}" \
    --init "$T/ckpt_ok/step_00000001"
if ! grep -q "^step 1/1 " "$T/out"; then bad=$((bad + 1)); echo "BAD  --init of a checkpoint: did not start at step 0"; fi
expect_success "control: --init of a checkpoint's model.bin" $TRAIN "${BASE[@]}" --init "$T/ckpt_ok/step_00000001/model.bin"
expect_startup_error "--init of a damaged checkpoint directory" \
    "--init $T/ckpt_dmg/step_00000001: damaged checkpoint: model.bin does not match the checksum in DONE" \
    $TRAIN "${BASE[@]}" --init "$T/ckpt_dmg/step_00000001"
expect_startup_error "--init of a damaged checkpoint's model.bin" \
    "--init $T/ckpt_dmg/step_00000001/model.bin: damaged checkpoint $T/ckpt_dmg/step_00000001: model.bin does not match" \
    $TRAIN "${BASE[@]}" --init "$T/ckpt_dmg/step_00000001/model.bin"
expect_error "--init of a directory of checkpoints" "--init $T/ckpt_ok: a directory of checkpoints" \
    $TRAIN "${BASE[@]}" --init "$T/ckpt_ok"
expect_error "--resume of a damaged checkpoint names --resume" "--resume $T/ckpt_dmg/step_00000001: damaged checkpoint" \
    $TRAIN "${BASE[@]}" --resume "$T/ckpt_dmg/step_00000001"

# output paths: checked at startup, before any training
expect_startup_error "--out-dir below a file" "--out-dir $T/good.bin/x" $TRAIN "${BASE[@]}" --init "$T/good.bin" \
    --out-dir "$T/good.bin/x"
expect_startup_error "--log below a file" "--log $T/good.bin" $TRAIN "${BASE[@]}" --init "$T/good.bin" \
    --log "$T/good.bin/log.txt"
expect_startup_error "a fresh run onto another run's --log" "--log $T/old.log" $TRAIN "${BASE[@]}" --init "$T/good.bin" \
    --log "$T/old.log"
expect_error "--log on a full disk" "--log /dev/full: write failed" $TRAIN "${BASE[@]}" --init "$T/good.bin" --log /dev/full
expect_success "control: --out-dir and --log with missing parents" $TRAIN "${BASE[@]}" --init "$T/good.bin" \
    --out-dir "$T/new/a/b" --log "$T/new/c/log.txt"

# flag values
expect_error "--lr abc" "--lr" $TRAIN "${BASE[@]}" --lr abc
expect_error "--lr without a value" "--lr" $TRAIN "${BASE[@]}" --lr
expect_error "--batch 0" "--batch" $TRAIN "${BASE[@]}" --batch 0
expect_error "--batch 1.5" "--batch" $TRAIN "${BASE[@]}" --batch 1.5
expect_error "--seq 0: an integer range in integers" "--seq: must be in [1, 1048576], got 0" $TRAIN "${BASE[@]}" --seq 0
expect_error "--lr below the smallest float" "--lr: '1e-400' is out of range: nonzero, but below the smallest float" \
    $TRAIN "${BASE[@]}" --lr 1e-400
expect_error "--lr above the largest float" "--lr: '1e39' is out of range: its magnitude is above a float's largest" \
    $TRAIN "${BASE[@]}" --lr 1e39
expect_error "--steps -2" "--steps" $TRAIN "${BASE[@]}" --steps -2
expect_error "--beta2 1" "--beta2" $TRAIN "${BASE[@]}" --beta2 1
expect_error "--schedule nope" "--schedule" $TRAIN "${BASE[@]}" --schedule nope
expect_error "--optimizer sgd" "--optimizer: unknown optimizer 'sgd' (adamw, muon)" $TRAIN "${BASE[@]}" --optimizer sgd
expect_error "--muon-lr without --optimizer muon" "--muon-lr: only with --optimizer muon" $TRAIN "${BASE[@]}" --muon-lr 0.1
expect_error "--muon-adjust-lr without --optimizer muon" "--muon-adjust-lr: only with --optimizer muon" $TRAIN \
    "${BASE[@]}" --muon-adjust-lr match_rms_adamw
expect_error "--muon-lr 0" "--muon-lr: must be in [1e-30, 10], got 0" $TRAIN "${BASE[@]}" --optimizer muon --muon-lr 0
expect_error "--muon-ns-steps 0" "--muon-ns-steps: must be in [1, 99], got 0" $TRAIN "${BASE[@]}" --optimizer muon \
    --muon-ns-steps 0
expect_error "--muon-momentum 1" "--muon-momentum: must be in [0, 1), got 1" $TRAIN "${BASE[@]}" --optimizer muon \
    --muon-momentum 1
expect_error "--muon-adjust-lr nope" "--muon-adjust-lr: unknown adjustment 'nope'" $TRAIN "${BASE[@]}" --optimizer muon \
    --muon-adjust-lr nope
expect_success "control: --optimizer muon at ZeRO 2 checkpoints (each rank updates whole matrices)" $TRAIN \
    "${BASE[@]}" --init "$T/good.bin" --optimizer muon --zero 2 --out-dir "$T/ckpt_muon_z2"
expect_success "control: a Muon run checkpoints" $TRAIN "${BASE[@]}" --init "$T/good.bin" --optimizer muon \
    --out-dir "$T/ckpt_muon"
expect_error "--fp8 1 on the CPU trainer" "--fp8 1: the CPU trainer runs in fp32" $TRAIN "${BASE[@]}" --fp8 1
expect_error "--fp8 2" "--fp8" $TRAIN "${BASE[@]}" --fp8 2
expect_error "--fp8-scaling on the CPU trainer" "--fp8-scaling current: the CPU trainer runs in fp32" $TRAIN "${BASE[@]}" \
    --fp8-scaling current
if [ -x $GPU ]; then  # the --fp8 flags are the GPU trainer's (not in the CPU trainer's --help); parsed before any device
    expect_error "GPU trainer: --fp8-scaling nope" "--fp8-scaling: unknown scaling 'nope'" $GPU "${BASE[@]}" --fp8-scaling nope
    expect_error "GPU trainer: --fp8-grad e3m4" "--fp8-grad: unknown format 'e3m4'" $GPU "${BASE[@]}" --fp8-grad e3m4
    expect_error "GPU trainer: --fp8-grad without --fp8 1" "only with --fp8 1" $GPU "${BASE[@]}" --fp8-grad e4m3
    expect_error "GPU trainer: --optimizer muon at ZeRO 2" "--zero 2: --optimizer muon runs at --zero 0 only" \
        $GPU "${BASE[@]}" --optimizer muon --zero 2
    expect_error "GPU trainer: --resume of a Muon checkpoint" \
        "--optimizer adamw: the checkpoint $T/ckpt_muon/step_00000001 holds muon's optimizer state" \
        $GPU "${BASE[@]}" --steps 2 --resume "$T/ckpt_muon"
fi
expect_error "unknown flag" "--frobnicate" $TRAIN "${BASE[@]}" --frobnicate 3
expect_error "--total-batch not a multiple of B*T" "--total-batch" $TRAIN "${BASE[@]}" --total-batch 100
expect_error "--total-batch of more micro-batches than an int" "--total-batch" $TRAIN "${BASE[@]}" --total-batch 68719476736
expect_error "--batch 65536 --seq 1024: out of host memory" "host memory" $TRAIN "${BASE[@]}" --init d1 --batch 65536 --seq 1024
expect_error "a flag as a flag's value" "--out-dir: missing value" $TRAIN "${BASE[@]}" --out-dir --log "$T/x.log"
expect_error "--steps 0" "--steps" $TRAIN "${BASE[@]}" --steps 0
expect_error "--seq longer than the model's" "--seq" $TRAIN "${BASE[@]}" --init "$T/good.bin" --seq 32
expect_error "--train missing" "--train" $TRAIN --init "$T/good.bin"

# the CPU test's own inputs
expect_error "test: truncated debug state" "$T/debug_truncated.bin" $TEST tests/fixture/model.bin "$T/debug_truncated.bin"
expect_error "test: debug state of another model" "tests/fixture/debug.bin" $TEST "$T/good.bin" tests/fixture/debug.bin

# document masking (--doc-mask): the document token comes from --doc-token or the tokenizer and must fit the vocabulary
expect_success "control: --doc-mask 1 takes the tokenizer's document token" $TRAIN "${BASE[@]}" --init "$T/good.bin" \
    --tokenizer "$T/tok.bin" --doc-mask 1 --doc-positions restart
grep -q "document masking: token 63 starts a document; positions restart" "$tmp/out" && ok=$((ok + 1)) ||
    { bad=$((bad + 1)); echo "BAD  --doc-mask 1 did not report the tokenizer's document token 63"; }
expect_startup_error "--doc-mask 1 with no document token" "--doc-mask 1: no document token" $TRAIN "${BASE[@]}" \
    --init "$T/good.bin" --doc-mask 1
expect_startup_error "--doc-token outside the vocabulary" "--doc-token 64: out of range for the model's vocabulary of 64" \
    $TRAIN "${BASE[@]}" --init "$T/good.bin" --doc-mask 1 --doc-token 64
expect_error "--doc-positions restart without --doc-mask" "--doc-positions restart: only with --doc-mask 1" $TRAIN \
    "${BASE[@]}" --init "$T/good.bin" --doc-positions restart
expect_error "--doc-token without --doc-mask" "--doc-token 3: only with --doc-mask 1" $TRAIN "${BASE[@]}" \
    --init "$T/good.bin" --doc-token 3
expect_error "--doc-positions sideways" "--doc-positions: unknown position mode 'sideways'" $TRAIN "${BASE[@]}" \
    --doc-positions sideways
if [ -x $GPU ]; then  # parsed before any device
    expect_error "GPU trainer: --doc-mask 1 with --fp8 1" "--doc-mask 1: not with --fp8 1 on the GPU yet" \
        $GPU "${BASE[@]}" --doc-mask 1 --fp8 1
    expect_error "GPU trainer: --doc-positions restart without --doc-mask" "--doc-positions restart: only with --doc-mask 1" \
        $GPU "${BASE[@]}" --doc-positions restart
fi

# --optimizer muon at ZeRO 1/2 (the CPU trainer): its checkpoint holds Muon's state, refused under AdamW
expect_error "--resume of a Muon ZeRO-2 checkpoint with --optimizer adamw" \
    "--optimizer adamw: the checkpoint $T/ckpt_muon_z2/step_00000001 holds muon's optimizer state" \
    $TRAIN "${BASE[@]}" --steps 2 --zero 2 --resume "$T/ckpt_muon_z2"
expect_success "control: the Muon ZeRO-2 checkpoint resumes with --optimizer muon at ZeRO 1" $TRAIN "${BASE[@]}" \
    --steps 2 --optimizer muon --zero 1 --resume "$T/ckpt_muon_z2"

echo "test_bad_inputs: $ok ok, $bad misbehaved"
[ $bad -eq 0 ]
