// attention_backward.cu: the attention backward lab (causal, GQA, sliding window).
// O and lse come from the shipped forward (attention_forward.cu checks it); dout and qkv are fresh
// random values. Each variant starts from a poisoned dqkv (it is written with `=`), is checked
// against the CPU reference (llmc/cpu/attention.h) on the first sequences of the batch, dQ, dK and
// dV each against their own scale, then timed by the shared harness.
//   10 naive: one thread a query (dQ) or key (dK/dV), operands from global memory, no smem, fp32
//      math (dev/cuda/attention_naive.cuh: naive -> tiled (1) -> tensor cores (2..8)); T <= 1024 only
//   0  shipped attention_backward (llmc/attention.cuh): tensor cores in the bf16 build, the simple
//      kernels in the FP32 build
//   1  attention_backward_simple: scalar fp32, a dQ pass and a dK/dV pass
//   2  tensor-core kernels capped at 168 registers (3 blocks/SM; spills at HD 128)   (bf16 only)
//   3  tensor-core kernels, no register cap                                            (bf16 only)
//   4  tensor-core kernels with 8 warps (128 resident rows a block)                   (bf16 only)
//   5  single pass, dQ by fp32 reductions into a scratch buffer (backward_flash_atomic with the
//      shipped AtomicBwdCfg; not bit-reproducible in dQ)                              (bf16 only)
//   6  single pass, 64 keys x 64 queries, per-warp skip                              (bf16 only)
//   7  single pass, HD 64: 2 m16 key tiles a warp (128 x 32); HD 128: 64 x 32; skip (bf16 only)
//   8  as 7 without the per-warp skip                                               (bf16 only)
//   9  cuDNN (llmc/cudnn_attention.cuh)                                   (bf16 with USE_CUDNN=1)
//   11 shipped attention_backward with a scratch buffer (the trainer's default, dQ by fp32 atomics):
//      the Hopper kernel (attention_backward_hopper, llmc/attention_hopper_backward.cuh) in sm_90a
//      builds (HD 64: the kernel of 16; HD 128: of 13), the single pass of 5 elsewhere   (bf16 only)
//   12 Hopper: wgmma + TMA + warp specialization, query tiles of 64, dQ by red.global.add
//      (the shipped HD 64 configuration until BQ 128 below)              (bf16, sm_90a builds)
//   13 Hopper as 12, dQ by TMA reductions (cp.reduce.async.bulk.tensor)   (bf16, sm_90a builds)
//   14 Hopper, HD 64: query tiles of 128 (dQ split by rows), dQ by red.add; HD 128: as 12
//                                                                         (bf16, sm_90a builds)
//   15..17 Hopper with dQ one query tile late (HopperBwdCfg's DELAY_DQ; dS^T handed over by split
//      arrive / sync named barriers), dQ by TMA reductions: 15 dQ under the next tile's softmax (1)
//      at HD 64 BQ 64; 16 dQ after the next tile's dV/dK (2) at HD 64 BQ 128; 17 as 16 at BQ 64;
//      HD 128 (BQ 64) is DELAY_DQ 2 in all three                         (bf16, sm_90a builds)
// A second op, attention_fwd+bwd, times forward then backward (shipped: 0 and 11, single pass: 5,
// cuDNN: 9),
// the figure ../shared/H200.md quotes for cuDNN and PyTorch. Variant 0 also runs twice more and
// must give bitwise-identical dqkv (the two-kernel path is deterministic by construction).
// FLOPs: the forward's (4 * HD per visible pair, 2*B*NH*T^2*HD causal) times 2.5 for the backward
// (5 matmuls to the forward's 2: the convention; the two-kernel path does 7, the single pass 5),
// times 3.5 for forward + backward. Bytes: qkv, out, dout, lse read once, dqkv written once (the
// single pass also moves its fp32 scratch: ~12 bytes per dQ element; not counted).
//
// Build: make -C dev/cuda [USE_CUDNN=1 CUDNN_FRONTEND_PATH=$PWD/build/cudnn_frontend/include]
// Run:   dev/cuda/build/attention_backward [variant ...] [--check-only] [--reps N] [--small]
//        --small: only three tiny awkward shapes (for compute-sanitizer --tool racecheck).
//
// Measured on one H200, 2026-12-02, bf16, TFLOP/s (2.5x the forward's FLOPs; fwd+bwd 3.5x), one run
// of `0 5 6 7 8 --reps 20` then one of `9 --reps 20` in the same call; every variant passed its
// checks (all 6 shapes and --small), racecheck on --small (0 5 6 7 8 of this numbering) reported 0
// hazards, and variant 0 gave bitwise-identical dqkv run against run on all 8 shapes. In that run
// the single-pass kernels now numbered 6, 7, 8 were timed as 6, 5, 7; variant 5 (AtomicBwdCfg) is
// 8's kernel at HD 64 and 6's at HD 128, so its column is copied from those; its fwd+bwd figure
// below was taken with 7's configuration (AtomicBwdCfg's before the run), the new one is not measured.
//   shape (B NH/NKV T HD W)       0 shipped  5     6 64x64  7      8 no skip  9 cuDNN | fwd+bwd: 0  5(7) 9
//   gpt2  64 12/12 1024  64       165.1      177.1 153.4    154.7  177.1      244.2   | 181.0  172.2 262.9
//   gqa   64 12/4  1024  64       162.2      173.0 148.7    148.0  173.0      229.9   | 178.0  167.0 252.2
//   long  16 16/16 4096 128       169.1      187.4 187.4    180.9  181.6      458.5   | 190.4  201.1 480.0
//   window 16 16/16 4096 128 256  116.8      124.8 124.8    122.7  118.6      190.9   | 131.2  136.3 214.5
//   odd    3  6/2   777 128        34.9       33.9  33.9     32.7   34.3      104.6   |  43.2   40.8 116.7
//   odd-w  5  4/4  1000  64 100    36.6       27.8  34.0     27.3   27.8       27.7   |  36.8   30.3  29.4
// Earlier, 2026-12-02 (variants 1..4 as now, 9 cuDNN): 1 simple 10.4 / 8.0 / 6.3 at gpt2 / long /
// window; 2 (the shipped HD 64 configuration) 166.5 at gpt2; 3 (the shipped HD 128 one) 168.9 at
// long; 4 (8 warps) 127.3 at gpt2, 167.3 at long.
// Errors: dq, dk, dv nmse 5.3e-6..5.7e-6 for every tensor-core variant (single pass included) and
// for cuDNN, 2.7e-6 for the fp32-math simple kernels. Of the time at gpt2 (profile_gpt2), the
// two-kernel path spends 64% in dK/dV, 36% in dQ.
// The single pass wins where the work is large (gpt2 +7%, long +11%, window +7% over variant 0) and
// loses on the small odd shapes, where its prologue (D, lse2, zeroing 4 bytes per dQ element) and
// epilogue (fp32 -> bf16 dQ) passes are a larger share. Window time over full-causal time (same B,
// NH, T, HD): 0.18 for variant 5 (2.67 / 14.67 ms), 0.29 for cuDNN; the goal of 1/8 is not met.
// Tried and dropped: 8-warp blocks (-12%); the 168-register cap at HD 128 (spills, -14%); in an
// earlier run of the same day (gpt2 only, not side by side with the numbers above): single pass
// with 8 warps (128 x 64) 133.5, 64 x 32 capped at 168 registers 150.9, 64 x 64 uncapped 142.7;
// a per-warp skip of invisible tiles in the two-kernel path ran variant 0 at 139.5 (against 165 in
// the run above without it), so it was taken out again.
// Not tried: a 16-byte (v4) reduction per thread (needs a shuffle), wgmma.
//
// ---- The Hopper kernels (11..13; this part was first measured in its own lab file, where 0 was the
// deterministic mma.sync pair, 1 the shipped Hopper configuration, 2 and 3 the kernels now 12 and 13,
// 8 the mma.sync single pass now 5).
// Measured on one H200, 2026-12-02, bf16, TFLOP/s (2.5x the forward's FLOPs), one process, --reps 10.
// In that run the kernels of 2 and 3 were numbered 3 and 5 and 1 pointed at a configuration since
// dropped (TMA for lse2/D, below), so 1's column is 2's at HD 64 and 3's at HD 128. Every variant below
// passed its checks on all 6 shapes and on --small. fwd+bwd for 1 is derived: the shipped forward's
// time (0's fwd+bwd minus 0's backward, same run) plus 1's backward.
//   shape (B NH/NKV T HD W)      0 mma   1 hopper  2 red   3 TMA   8 mma 1-pass  9 cuDNN  1/9  | fwd+bwd 0  1    9
//   gpt2  64 12/12 1024  64      165.4   194.9   194.9   187.6   176.6         244.6  0.80 |       195.5 224  263.0
//   long  16 16/16 4096 128      168.8   402.4   336.7   402.4   186.5         465.4  0.86 |       212.3 443  471.8
//   gqa   64 12/4  1024  64      162.4   208.7   208.7   201.4   172.7         229.0  0.91 |       192.4 237  250.5
//   window 16 16/16 4096 128 256 116.9   157.5   143.5   157.5   124.7         190.6  0.83 |       142.2 183  213.9
//   odd    3  6/2   777 128       35.2    49.0    40.8    49.0    33.8         106.9  0.46 |        46.1  -   117.5
//   odd-w  5  4/4  1000  64 100   37.7    25.8    25.8    24.8    28.6          27.9  0.93 |        40.7  -    29.5
// Errors: dq, dk, dv nmse 4.9e-6..5.7e-6, as the mma.sync kernels and cuDNN. Registers (ptxas): 168 at
// launch, setmaxnreg 40 (producer) / 232 (consumers), no spills in any configuration above.
// racecheck (--small) was not clean for the Hopper kernels until commit ae4f070, always on lse2/D
// alone: 16 hazards with the producer lanes' cp.async (that run), 32 with plain producer stores
// (commit b2f253e), 16 with the bulk copies from 64-padded rows (commit 6be395c). Each was a write of
// a stage's lse2/D against the consumers' ordinary loads of them, ordered only by the stage's
// mbarriers. Since ae4f070 one tensor-map TMA box (rows_map: D and lse2 of the tile, the padded rows
// keep it 16-byte aligned) brings them in, and racecheck reports 0 hazards on 11, 12 and 13, speed
// unchanged (gpt2 195.2, long 411.4 in that check): the copy engine's plain bulk writes were what
// racecheck could not order.
// Measured with the shipped code (commit 6be395c, one process, --reps 10, TFLOP/s), 11 / 12 / 13 /
// cuDNN: gpt2 196.8 / 196.4 / 187.5 / 245.4, gqa 209.7 / 209.9 / 200.5 / 229.5, long 407.2 / 338.1 /
// 407.2 / 492.9, window 158.0 / 144.5 / 157.6 / 190.1, odd 50.3 / 41.7 / 50.2 / 108.6, odd-w 25.3 /
// 25.5 / 24.5 / 27.6; fwd+bwd 11 / cuDNN: 224.6 / 262.3, 237.0 / 249.7, 433.5 / 488.5, 185.2 /
// 213.7, 62.6 / 118.5, 29.8 / 29.7. Every variant passed its checks; memcheck of 11-13 on --small: 0
// errors.
// odd-w (T 1000, W 100) is launch- and prologue-bound (36 us): the two extra passes cost more than the
// single kernel saves; the deterministic mma.sync path (0) wins there.
//
// What each step bought (each against the previous state, side by side in its run unless said):
//   * wgmma + TMA + warp specialization, dQ split by columns between the consumer warpgroups with
//     red.add, key-tile-major persistent order (first run): gpt2 199.8 / long 302.3 / gqa 212.0 / window
//     147.2 / odd 48.3 against the mma.sync single pass 177 / 187 / 173 / 125 / 34 and cuDNN 244 / 466.
//   * dQ by TMA reductions instead of red.add: long 311.5 vs 292.4, gpt2 192.9 vs 197.8 (so HD 128 only).
//   * work order for L2 (the key tiles of one (kv head, sequence) run together, long and short causal
//     tiles paired per CTA): long 311.5 -> 402.4 with TMA reductions, 292.4 -> 336.7 with red.add;
//     window 142.4 -> 157.5 (TMA), 147.1 -> 143.5 (red.add); gpt2 197.8 -> 194.9, gqa 209.4 -> 208.7.
//     Not side by side: the last two runs, which also differ in lse2/D (TMA then, cp.async now) and the
//     producer's registers (24 then, 40 now); the run-to-run spread is ~2%. ncu at gpt2 in the
//     key-tile-major order: DRAM 58% busy (2.8 TB/s), L2 hit rate 43%, 32% of issue slots busy: each of
//     the 132 CTAs streamed Q, dO and dq_accum rows of another (head, sequence).
// Tried and dropped:
//   * dQ split by keys (each warpgroup all HD columns over its own 64 keys: no barrier between the
//     warpgroups, twice the reductions): gpt2 172.5 vs 199.8, long 230.8 vs 302.3 with red.add; 184.1
//     vs 192.9, 250.9 vs 311.5 with TMA reductions (at HD 128 ptxas serialises its wgmma: registers).
//   * 3 query-tile stages: 197.0 vs 197.8 (gpt2), 292.3 vs 292.4 (long).
//   * Intra-warpgroup overlap (S^T, dP^T of the next tile issued before this tile's dQ is reduced, FA3's
//     trick): a wgmma in flight across the loop's back edge makes ptxas serialise every wgmma of the
//     kernel (C7514 "non wgmma instructions reading accumulator registers"): gpt2 169.6 / 173.7 vs 192.9,
//     long 238.4 (S and dP: 396 bytes of spills) / 311.0 vs 310.8. Reducing the previous tile's dQ under
//     the next S^T, dP^T (nothing in flight at the back edge) still got a compiler-inserted
//     warpgroup.wait before the reduction (C7517; ptxas follows the registers' GMMA origin through
//     moves and bit casts) and was not timed.
//   * lse2 and D by TMA (a one-row 2-D tensor map over the flat D | lse2 array): an illegal instruction
//     when T % 4 != 0 (memcheck points at the cp.async.bulk.tensor: a box's first element must be
//     16-byte aligned in global memory, and (b, h)'s row starts at (b * NH + h) * T). A box aligned
//     down to 4 elements (68 wide, the consumers reading at an offset) would fix it: not tried.
//   * The producer at 24 registers (consumers 240): its loop spills; 40 / 232 costs nothing measurable.
//
// ---- Query tiles of 128 at HD 64 (uncommitted change on 21d76fb; the lse2/D box of rows_map as the
// lead left it). S^T, dP^T become m64n128 (64 + 64 accumulators beside dK, dV's 32 + 32: 240 registers
// a consumer, so the producer at 24; 232 spilled one value), dQ split by query rows (each consumer
// warpgroup its own 64 rows x all 64 columns over the 128 keys: m64n64 instead of m64n32), so half
// the waits and barriers per FLOP. Measured on one H200, bf16, TFLOP/s, --reps 10, cuDNN in the same
// process; every variant passed its checks on all 6 shapes; memcheck (--small): 0 errors; racecheck
// (--small, 11 and 14): 0 hazards. Second run (the code as it is now: 11 = BQ 128 + TMA reductions at
// HD 64, unchanged at HD 128):
//   shape     11 shipped  12 BQ64 red  13 BQ64 TMA  14 BQ128 red  9 cuDNN  11/9  11/12 | fwd+bwd 11   9    11/9
//   gpt2      221.1       194.0        187.8        207.6         243.0    0.91  1.14  |        247.3 262.0 0.94
//   gqa       243.0       207.5        201.4        222.0         227.4    1.07  1.17  |        265.7 248.5 1.07
//   long      410.3       338.3        410.2        338.3         502.2    0.82   -    |        436.3 498.5 0.88
//   window    159.3       144.5        159.3        144.6         189.8    0.84   -    |        185.2 213.2 0.87
//   odd        49.8        41.4         50.0         41.5         106.2    0.47   -    |         63.2 116.5 0.54
//   odd-w      27.5        26.0         25.4         26.4          28.4    0.97  1.06  |         30.7  29.4 1.04
// First run (numbering of that build: 11 = the previous shipped cfg, BQ 64, red.add at HD 64; 14 =
// today's 14; 15 = 14 + K/V double-buffered across items; 16 = BQ 64 + K/V double-buffered (HD 128:
// red.add); 17 = 15 + red.add.v4; 18 = today's 11), gpt2 / gqa / long / window: 11 194.7 / 208.2 /
// 411.0 / 159.9, 14 208.3 / 223.5, 15 207.6 / 223.4 / 337.1 / 145.5, 16 188.8 / 201.0 / 337.8 /
// 145.5, 17 205.9 / 220.3 / 334.5 / 144.9, 18 222.0 / 243.5 / 409.3 / 159.9, cuDNN 244.5 / 228.8 /
// 492.3 / 190.9. With BQ 128 the TMA reductions win at HD 64 too (+7% over red.add; at BQ 64 they
// lost 4%): the red.add of 16 dQ pairs a thread sat on each warpgroup's critical path every tile.
// ncu of 11 at gpt2 (unlocked clocks): 971 us, SM throughput 31%, issue slots 32% busy, 0.44 eligible
// warps a scheduler (unchanged: still latency-bound), L2 hit 76%, DRAM 21%; grid 128 of 132 SMs (a
// multiple of the 8 key tiles of T 1024: 4 SMs idle).
// Tried and dropped (first run):
//   * K/V double-buffered across items (the next item's K/V and first Q tiles load while this item
//     finishes): 207.6 vs 208.3 at gpt2 (BQ 128), 188.8 vs 194.7 (BQ 64); the item change is not
//     exposed enough to matter. At HD 128 it fits only with red.add (smem): 337.8 (16), as 12 (338.3
//     in the second run).
//   * red.global.add.v4.f32 (lane pairs swap a row's column pair by a shuffle, half the reductions):
//     205.9 vs 207.6 at gpt2.
//   * setmaxnreg 32 / 240 hangs: the CTA's pool is the 168 x 384 registers of the launch, not 64K, and
//     setmaxnreg.inc past it waits forever (the static_assert now checks that pool).
// Next: break the lockstep of the two consumer warpgroups (ping-pong: delay dQ by a tile, so each
// warpgroup waits only for the other's dS^T of the previous tile, mbarriers instead of the named
// barrier, three dS^T buffers; or 3 consumer warpgroups of 64 keys, BKV 192); a grid that uses all
// 132 SMs at T 1024 (now 128); at HD 128 (no BQ 128: registers) the same lockstep is the limit.
//
// ---- dQ one query tile late (measured as an uncommitted change on 63dd54e, committed as 7e71c02, which
// also made DELAY_DQ 2 the shipped HD 64 configuration: 11 = 16 at HD 64; HopperBwdCfg's 5th parameter). Each consumer warpgroup issues dQ(n-1) in tile n, so it
// waits only for the other warpgroup's dS^T of the previous tile instead of meeting it at one barrier
// every tile. Per direction and tile parity a named barrier (ids 4..7, 256 threads): a warpgroup
// bar.arrives on "my dS^T(n) is in smem and my dQ(n-1) has completed" after tile n's wgmma_wait<0>,
// the other bar.syncs on it before it issues dQ(n) (and before it stores dS^T(n+1) into the buffer
// dQ(n-1) read): two dS^T buffers, one arrive per id between two syncs of it. First tile of an item:
// no dQ; after the last a tail step (sync, dQ, wait, reduce) before kv_empty. The three step shapes
// are compile-time (a generic lambda on std::integral_constant), nothing in flight at the back edge.
//   DELAY_DQ 1: dQ(n-1) issued right after S^T(n), dP^T(n) (wait<2>, wait<1>: P^T and dS^T of tile n
//     computed while it runs). DELAY_DQ 2: issued after dV/dK(n) (sync, store dS^T(n), dQ(n-1), one
//     wait<0>): the registers of today's schedule.
//   Registers (ptxas -v, consumers 240 / producer 24 for every DELAY_DQ config): HD 64 BQ 64: 0 spills
//     with 1 and with 2; HD 64 BQ 128, 2: spills 8 bytes stores / 24 loads (the same at 232), no
//     C75xx; HD 128 BQ 64, 2: 60 / 104 bytes, no C75xx (storing dS^T before dQ's accumulators are
//     taken brought it from 76 / 124; 96 / 160 at 232 consumer registers). DELAY_DQ 1 does not fit
//     where S^T, dP^T or dK, dV are large: BQ 128 at HD 64 264 / 280 bytes, HD 128 580 / 544, both
//     with C7512 (wgmma serialised), after the fix below too (not timed). Trap found:
//     the first tile of an item, peeled out of the loop, let the compiler materialise dK, dV's zeros
//     between the wgmma_fence and the dV/dK wgmma: C7519 (warpgroup.arrive injected) on every DELAY_DQ
//     config and C7512 on the large ones; fence_regs(dk), fence_regs(dv) after the zeroing fixed it.
// Measured on one H200, bf16, TFLOP/s, `11 13 15 16 17 9 --reps 10`, one process; every variant passed
// its checks on all 6 shapes (0 failed); memcheck (--small, 15 16 17): 0 errors; racecheck (--small)
// 16: 0 hazards, 15: 0 hazards (each alone, 1-2 s; one racecheck call of 11 15 16 17 together ran
// past its 55 s limit with no output, not looked into). At HD 128 15, 16 and 17 are one kernel
// (<128, 2, true, 64, 2>) and 11 and 13 another (<128, 2, true, 64>): their spread is the noise.
//   shape     11 shipped  13 BQ64 TMA  15 late 1  16 late 2  17 late 2  9 cuDNN  16/11  16/9   11/9  15/13  17/13
//                                      BQ 64      BQ 128     BQ 64
//   gpt2      221.5       188.0        209.4      233.0      210.4      244.3    1.05   0.95   0.91  1.11   1.12
//   gqa       243.7       202.2        228.5      265.8      232.6      228.3    1.09   1.16   1.07  1.13   1.15
//   long      411.4       411.3        408.0      417.4      418.7      473.8    1.01   0.88   0.87   -      -
//   window    159.7       159.7        159.3      159.0      158.9      191.0    1.00   0.83   0.84   -      -
//   odd        50.3        50.0         52.8       53.0       52.7      105.7    1.05   0.50   0.48   -      -
//   odd-w      27.1        25.0         26.2       27.4       26.9       28.7    1.01   0.95   0.95  1.05   1.08
// At HD 64 the late dQ buys 11-15% at BQ 64 (15, 17 vs 13) and 5% / 9% at BQ 128 (16 vs 11, gpt2 /
// gqa: gqa 1.16x cuDNN, gpt2 0.95x); issuing dQ under the softmax (1) is no better than after dV/dK
// (2) at BQ 64 (209.4 vs 210.4), so the gain is the broken lockstep, not the overlap inside a
// warpgroup. HD 128: neutral (long within the 408..419 spread of one kernel, window -0.3%), odd +5%.
// The existing configurations' machine code is byte-identical to 63dd54e's (the .text of all six
// attention_backward_wgmma instantiations compared, cubin against cubin).
// Not tried: finding the HD 128 DELAY_DQ 2 spills (no disassembler here); a third dS^T buffer (arrive before
// the wait; 32 KB more smem at HD 64 BQ 128, over the 227 KB by ~50 bytes); 3 consumer warpgroups.
// The fifth verification run (docs/perf.md, commit 7e71c02, shipped = 16 at HD 64): 11 gpt2 233.6 /
// gqa 266.3 / long 409.7 vs cuDNN 244.7 / 229.6 / 468.9; racecheck (--small) 0 hazards on 11, 15, 16
// and 17, each alone in 1-2 s.
#include "attention_common.cuh"
#include "llmc/attention.cuh"
#include "attention_naive.cuh"
#include "llmc/cpu/attention.h"
#if defined(USE_CUDNN)
#include "llmc/cudnn_attention.cuh"
#endif

// Splits the first `rows` token rows of a dqkv-shaped (rows, (NH + 2*NKV) * HD) array into dQ, dK, dV.
static void split_dqkv(const std::vector<float>& a, size_t rows, int NH, int NKV, int HD, std::vector<float> parts[3]) {
    const size_t row = (size_t)(NH + 2 * NKV) * HD, widths[3] = {(size_t)NH * HD, (size_t)NKV * HD, (size_t)NKV * HD};
    for (int p = 0; p < 3; p++) parts[p].clear();
    for (size_t r = 0; r < rows; r++) {
        size_t col = 0;
        for (int p = 0; p < 3; p++) {
            parts[p].insert(parts[p].end(), a.begin() + r * row + col, a.begin() + r * row + col + widths[p]);
            col += widths[p];
        }
    }
}

static int determinism_failures = 0;  // checks outside the harness's variants (exit status)

static void run_shape(lab::Lab& lab, const Shape& s, uint64_t seed) {
    const int B = s.B, T = s.T, NH = s.NH, NKV = s.NKV, HD = s.HD, W = s.window, RB = s.ref_batches;
    const size_t row = (size_t)(NH + 2 * NKV) * HD;
    const size_t n_qkv = (size_t)B * T * row, n_out = (size_t)B * T * NH * HD, n_lse = (size_t)B * NH * T;
    const std::vector<float> qkv_h = lab::rand_uniform(n_qkv, seed, -2.0f, 2.0f);  // score std 4/3
    const std::vector<float> dout_h = lab::rand_uniform(n_out, seed ^ 0xD0D0D0D0ull);
    cudaStream_t st = lab.stream();
    lab::DevBuf<floatX> qkv(n_qkv, "qkv"), dout(n_out, "dout"), out(n_out, "out"), dqkv(n_qkv, "dqkv");
    lab::DevBuf<float> lse(n_lse, "lse");
    qkv.upload(qkv_h);
    dout.upload(dout_h);
    attention_forward(out, lse, qkv, B, T, NH, NKV, HD, st, W);
    cudaCheck(cudaStreamSynchronize(st));

    // Reference from the very O and lse the kernels read.
    const std::vector<float> out_h = out.download(0, (size_t)RB * T * NH * HD), lse_h = lse.download(0, (size_t)RB * NH * T);
    std::vector<float> dqkv_ref((size_t)RB * T * row), ref_parts[3];
    cpu::attention_backward(dqkv_ref.data(), dout_h.data(), qkv_h.data(), out_h.data(), lse_h.data(), RB, T, NH, NKV,
                            HD, W);
    split_dqkv(dqkv_ref, (size_t)RB * T, NH, NKV, HD, ref_parts);

    auto reset = [&] { dqkv.poison(st); };
    auto check = [&] {
        cudaCheck(cudaDeviceSynchronize());
        bool ok = true;
        if (size_t n = dqkv.count_unwritten()) {
            printf("    dqkv       FAIL: %zu of %zu elements never written\n", n, dqkv.size());
            ok = false;
        }
        if (!dqkv.guard_intact()) {
            printf("    dqkv       FAIL: the kernel wrote into the guard region after the output\n");
            ok = false;
        }
        std::vector<float> got_parts[3];
        split_dqkv(dqkv.download(0, (size_t)RB * T * row), (size_t)RB * T, NH, NKV, HD, got_parts);
        const char* names[3] = {"dq", "dk", "dv"};
        for (int p = 0; p < 3; p++) ok &= compare_attention(lab, names[p], got_parts[p], ref_parts[p]);
        return ok;
    };
    const double fwd_flops = 4.0 * HD * B * NH * visible_pairs(T, W);
    const double bytes = (double)(2 * n_qkv + 2 * n_out) * sizeof(floatX) + n_lse * sizeof(float);
    const std::string shape = lab::Lab::strprintf("%s B=%d T=%d NH=%d NKV=%d HD=%d W=%d", s.name, B, T, NH, NKV, HD, W);
    const std::string op = "attention_backward " + shape, op2 = "attention_fwd+bwd " + shape;
    auto variant = [&](int v, const char* what, const std::function<void()>& launch) {
        lab.run(op, v, what, bytes, 2.5 * fwd_flops, lab::Bound::Compute, reset, launch, check);
    };

    variant(0, "shipped", [&] { attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, st, W); });
    if (lab.selected(0)) {  // the shipped path must be bit-reproducible: two runs, every byte of dqkv
        std::vector<float> first;
        for (int run = 0; run < 2; run++) {
            dqkv.poison(st);
            attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, st, W);
            cudaCheckLaunch();
            std::vector<float> got = dqkv.download();
            if (run == 0) first = std::move(got);
            else if (memcmp(first.data(), got.data(), got.size() * sizeof(float)) != 0) {
                printf("FAIL determinism: two runs of variant 0 differ\n");
                determinism_failures++;
            } else printf("    determinism: two runs of variant 0 give bitwise-identical dqkv\n");
        }
    }
    variant(1, "simple fp32", [&] { attention_backward_simple(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, st, W); });
    if (T <= 1024)
        variant(10, "naive", [&] { attention_backward_naive(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, st, W); });
#if !defined(PRECISION_FP32)
    using namespace attention_detail;
    const QKVLayout L{NH, NKV, HD};
    variant(2, "mma, 168 registers", [&] {
        if (HD == 64) backward_flash<FlashCfg<64, 4, 64, 3>, FlashCfg<64, 4, 64, 3>>(dqkv, dout, qkv, out, lse, B, T, L, W, st);
        else backward_flash<FlashCfg<128, 4, 32, 3>, FlashCfg<128, 4, 32, 3>>(dqkv, dout, qkv, out, lse, B, T, L, W, st);
    });
    variant(3, "mma, no register cap", [&] {
        if (HD == 64) backward_flash<FlashCfg<64, 4, 64, 1>, FlashCfg<64, 4, 64, 1>>(dqkv, dout, qkv, out, lse, B, T, L, W, st);
        else backward_flash<FlashCfg<128, 4, 32, 1>, FlashCfg<128, 4, 32, 1>>(dqkv, dout, qkv, out, lse, B, T, L, W, st);
    });
    variant(4, "mma, 8 warps", [&] {
        if (HD == 64) backward_flash<FlashCfg<64, 8, 64, 1>, FlashCfg<64, 8, 64, 1>>(dqkv, dout, qkv, out, lse, B, T, L, W, st);
        else backward_flash<FlashCfg<128, 8, 32, 1>, FlashCfg<128, 8, 32, 1>>(dqkv, dout, qkv, out, lse, B, T, L, W, st);
    });
    // single pass, dQ by fp32 reductions (not bit-reproducible): configurations by HD
    lab::DevBuf<float> scratch(attention_backward_scratch_floats(B, T, NH, HD), "scratch");
    auto atomic = [&](int v, const char* what, auto cfg64, auto cfg128) {
        variant(v, what, [&] {
            if (HD == 64) backward_flash_atomic<decltype(cfg64)>(dqkv, scratch, dout, qkv, out, lse, B, T, L, W, st);
            else backward_flash_atomic<decltype(cfg128)>(dqkv, scratch, dout, qkv, out, lse, B, T, L, W, st);
        });
    };
    atomic(5, "single pass (AtomicBwdCfg)", AtomicBwdCfg<64>{}, AtomicBwdCfg<128>{});
    atomic(6, "single pass, 64 keys x 64 queries", AtomicCfg<64, 4, 1, 64, 3>{}, AtomicCfg<128, 4, 1, 64, 2>{});
    atomic(7, "single pass, 2 m16 tiles a warp (HD 64) / 64 x 32 (HD 128)", AtomicCfg<64, 4, 2, 32, 2>{},
           AtomicCfg<128, 4, 1, 32, 2>{});
    atomic(8, "single pass as 7, no per-warp skip", AtomicCfg<64, 4, 2, 32, 2, false>{},
           AtomicCfg<128, 4, 1, 32, 2, false>{});
    variant(11, "shipped, dQ atomics (scratch)",
            [&] { attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, st, W, scratch); });
#if defined(LLMC_SM90A)
    // HopperBwdCfg<HD, stages, dQ by TMA reductions, BQ (64 unless given)>
    auto hopper = [&](int v, const char* what, auto cfg64, auto cfg128) {
        variant(v, what, [&] {
            using namespace attention_hopper_detail;
            if (HD == 64) backward_hopper<decltype(cfg64)>(dqkv, scratch, dout, qkv, out, lse, B, T, L, W, st);
            else backward_hopper<decltype(cfg128)>(dqkv, scratch, dout, qkv, out, lse, B, T, L, W, st);
        });
    };
    hopper(12, "Hopper, BQ 64, dQ by red.add", attention_hopper_detail::HopperBwdCfg<64, 2, false>{},
           attention_hopper_detail::HopperBwdCfg<128, 2, false>{});
    hopper(13, "Hopper, BQ 64, dQ by TMA reduce", attention_hopper_detail::HopperBwdCfg<64, 2, true>{},
           attention_hopper_detail::HopperBwdCfg<128, 2, true>{});
    hopper(14, "Hopper, HD 64: BQ 128, dQ by red.add (HD 128: as 12)",
           attention_hopper_detail::HopperBwdCfg<64, 2, false, 128>{},
           attention_hopper_detail::HopperBwdCfg<128, 2, false>{});
    // HopperBwdCfg<..., DELAY_DQ>: dQ one tile late, split barriers; 1: issued under the next tile's
    // softmax, 2: after the next tile's dV/dK
    hopper(15, "Hopper, dQ late under the softmax (1): BQ 64, TMA reduce (HD 128: late after dV/dK (2))",
           attention_hopper_detail::HopperBwdCfg<64, 2, true, 64, 1>{},
           attention_hopper_detail::HopperBwdCfg<128, 2, true, 64, 2>{});
    hopper(16, "Hopper, dQ late after dV/dK (2): HD 64 BQ 128, TMA reduce (HD 128: as 15)",
           attention_hopper_detail::HopperBwdCfg<64, 2, true, 128, 2>{},
           attention_hopper_detail::HopperBwdCfg<128, 2, true, 64, 2>{});
    hopper(17, "Hopper, dQ late after dV/dK (2): BQ 64, TMA reduce (HD 128: as 15)",
           attention_hopper_detail::HopperBwdCfg<64, 2, true, 64, 2>{},
           attention_hopper_detail::HopperBwdCfg<128, 2, true, 64, 2>{});
#endif
#endif
#if defined(USE_CUDNN)
    const bool cudnn = lab.selected(9) && cudnn_attention_supported(false, B, T, NH, NKV, HD, W) &&
                       cudnn_attention_supported(true, B, T, NH, NKV, HD, W);
    if (cudnn) variant(9, "cuDNN", [&] { cudnn_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, st, W); });
#endif

    // forward + backward, as training runs them
    lab.run(op2, 0, "shipped", bytes, 3.5 * fwd_flops, lab::Bound::Compute, reset, [&] {
        attention_forward(out, lse, qkv, B, T, NH, NKV, HD, st, W);
        attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, st, W);
    }, check);
#if !defined(PRECISION_FP32)
    lab.run(op2, 5, "single pass", bytes, 3.5 * fwd_flops, lab::Bound::Compute, reset, [&] {
        attention_forward(out, lse, qkv, B, T, NH, NKV, HD, st, W);
        if (HD == 64) backward_flash_atomic<AtomicBwdCfg<64>>(dqkv, scratch, dout, qkv, out, lse, B, T, L, W, st);
        else backward_flash_atomic<AtomicBwdCfg<128>>(dqkv, scratch, dout, qkv, out, lse, B, T, L, W, st);
    }, check);
    lab.run(op2, 11, "shipped, dQ atomics", bytes, 3.5 * fwd_flops, lab::Bound::Compute, reset, [&] {
        attention_forward(out, lse, qkv, B, T, NH, NKV, HD, st, W);
        attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, st, W, scratch);
    }, check);
#endif
#if defined(USE_CUDNN)
    if (cudnn) {
        // cuDNN's own O and lse go to separate buffers, so the reference above stays the one for ours
        lab::DevBuf<floatX> out2(n_out, "out2");
        lab::DevBuf<float> lse2(n_lse, "lse2");
        lab.run(op2, 9, "cuDNN", bytes, 3.5 * fwd_flops, lab::Bound::Compute, reset, [&] {
            cudnn_attention_forward(out2, lse2, qkv, B, T, NH, NKV, HD, st, W);
            cudnn_attention_backward(dqkv, dout, qkv, out2, lse2, B, T, NH, NKV, HD, st, W);
        }, check);
    }
#endif
}

int main(int argc, char** argv) {
    std::vector<char*> args;
    const bool small = take_small_flag(argc, argv, args);
    lab::Lab lab((int)args.size(), args.data(), "attention_backward.cu");
    uint64_t seed = 4321;
    if (small)
        for (const Shape& s : SMALL_SHAPES) run_shape(lab, s, seed++);
    else
        for (const Shape& s : FULL_SHAPES) run_shape(lab, s, seed++);
    const int status = lab.finish();
    if (determinism_failures) printf("# %d determinism check(s) failed\n", determinism_failures);
    return status || determinism_failures ? 1 : 0;
}
