// step_sync.h: which counters each kernel of a decode step waits on, counts into and resets when the
// fused step's kernels replace griddepcontrol.wait by counter waits (gpt2_infer.cuh, --step-sync 1;
// the device side, step_wait and step_arrive, is in llmc/cuda_common.cuh). Plain C++: the CPU test
// tests/test_step_sync.cpp plays the protocol through random schedules.
// One int counter per kernel of the step, in launch order, in one device array of n, zero at start:
//   kernel k waits until counter k-1 reaches the blocks of kernel k-1 (k = 0: pdl_wait, its
//   predecessor is the sampler or nothing), triggers its dependents after the wait (as before: at
//   most two grids live), and its blocks count into counter k as they finish (the last kernel, which
//   nobody waits for, counts nothing).
//   Resets without a memset: after its wait, block 0 of kernel k zeroes counter k-2 (every block of
//   k-1 has passed its wait on it, and every block of k-2 has counted in: nobody reads or counts into
//   it again this step); kernel 0 zeroes counter n-2, the one kernel n-1 waited on (the previous step
//   is complete: the step's first kernel is a plain launch). That needs n >= 3 (at n = 2 counter
//   n-2 is kernel 0's own, which its other blocks may already have counted into): a shorter chain
//   gets no counters (every kernel keeps pdl_wait).
// Deadlock-free without co-residency conditions: kernel k's blocks are scheduled only after every
// block of k-1 has triggered (PTX griddepcontrol.launch_dependents: "all CTAs issued it or
// completed"), so the grid a kernel spins on is all resident (or done) and itself waits on nothing
// unfinished.
// early_trigger (--step-sync 2): each kernel but kernel 0 triggers its dependents first thing,
// before its wait, so PDL keeps launching later kernels while SM slots are free (each prefetching
// its weights): a pipeline of many grids, not two. Still deadlock-free: every launched kernel but the newest has all
// its blocks started (the trigger needs them all), and the oldest unfinished kernel waits on a
// complete counter, so it finishes. Still ordered: a kernel writes and reads the data of earlier
// kernels only after its wait, and a full counter k-1 means every kernel before k has counted in
// (each of k-1's blocks passed its own wait first). What it gives up: before its wait a kernel may
// now run beside any earlier kernel, so it reads nothing there that the step writes, or checks it
// after the wait (the GEMVs' residual moves after it; the decode attention reads pos again and drops
// its early key loads if pos moved). Kernel 0 keeps its
// trigger after the wait and its reset of counter n-2 (fenced): otherwise the whole chain could
// launch at once and kernel n-1 pass its wait on the count the previous step left there
// (tests/test_step_sync.cpp finds that schedule).
// Counter i lives at counters[i * STEP_COUNTER_STRIDE]: one 128-byte line each, so the blocks that
// poll one counter and those that count into the next do not share an L2 line.
#pragma once

constexpr int STEP_COUNTER_STRIDE = 32;  // ints

struct StepSync {
    int* counters = nullptr;  // (n * STEP_COUNTER_STRIDE) or nullptr: pdl_wait, no count (outside the fused step)
    int wait = -1;            // counter waited on (-1: pdl_wait)
    int wait_blocks = 0;      // the count that releases the wait: the blocks of that kernel
    int arrive = -1;          // counter this kernel's blocks count into (-1: none)
    int reset0 = -1;          // counter block 0 zeroes after the wait (-1: none)
    bool early_trigger = false;  // trigger the dependents before the wait (only with counters)
};

// The chain of one step, built launch by launch: sync() for the next kernel, then launched(its blocks).
struct StepChain {
    int* counters = nullptr;  // nullptr: no chain, every sync() is the value-initialized StepSync
    int n = 0;                // kernels in the chain (the counters)
    int next = 0;             // the next kernel's index
    int prev_blocks = 0;      // the blocks of the kernel before it
    bool early_trigger = false;
    // last: the chain's final kernel (it counts nothing)
    StepSync sync(bool last = false) const {
        StepSync s;
        if (!counters || n < 3) return s;
        s.counters = counters;
        s.wait = next - 1;
        s.wait_blocks = prev_blocks;
        s.arrive = last ? -1 : next;
        s.reset0 = next == 0 ? n - 2 : next >= 2 ? next - 2 : -1;
        s.early_trigger = early_trigger && next > 0;
        return s;
    }
    void launched(int blocks) {
        prev_blocks = blocks;
        next++;
    }
};
