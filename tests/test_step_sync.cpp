// test_step_sync: the counter protocol of the fused decode step (llmc/step_sync.h, the chain that
// gpt2_infer.cuh builds with --step-sync 1 and 2) played on the CPU through random schedules. A model
// of the device: each block of each kernel starts (kernel 0 of a step once the previous step is done,
// a later kernel once every block of the one before it has triggered, as PDL allows: after its wait,
// or with the early trigger (--step-sync 2) as soon as it started, so many kernels run at once),
// passes its wait (pdl_wait for kernel 0; else its counter at the blocks of its producer; block 0
// then zeroes its reset counter) and counts in at exit. Random block counts, chain lengths and orders
// of the enabled events, several steps in a row (the counters carry over, as graph replays). Checks:
//   - a wait is released only when every block of its producer, in this step, has counted in (a
//     reset too late would leave last step's count and release it early);
//   - no counter is zeroed after a block of this step counted into it (a reset too early would lose
//     counts: the wait never releases, a deadlock), i.e. every schedule finishes;
//   - a counter never exceeds its kernel's blocks; the chain without counters, or of 2 kernels (too
//     short for the resets), is all defaults.
// Run: build/test_step_sync (well under a second).
#include <cstdint>
#include <cstdio>
#include <vector>
#include "llmc/step_sync.h"
#include "tests/check.h"

namespace {

struct Block {
    int phase = 0;  // 0 not started, 1 started (before its wait), 2 past its wait, 3 counted in (done)
};

uint64_t next_rand(uint64_t& s) {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Plays `steps` steps of a chain of n kernels with the given block counts; returns false on a stall.
bool play(int n, const std::vector<int>& blocks, int steps, bool early_trigger, uint64_t seed) {
    std::vector<int> counters(n, 0);
    uint64_t rng = seed;
    for (int step = 0; step < steps; step++) {
        // the host side: the syncs the launches would get
        StepChain ch;
        ch.counters = counters.data();
        ch.n = n;
        ch.early_trigger = early_trigger;
        std::vector<StepSync> sync(n);
        for (int k = 0; k < n; k++) {
            sync[k] = ch.sync(k == n - 1);
            ch.launched(blocks[k]);
        }
        CHECK(ch.next == n, "chain of %d kernels ended at %d", n, ch.next);
        std::vector<std::vector<Block>> b(n);
        for (int k = 0; k < n; k++) b[k].resize(blocks[k]);
        auto all_at_least = [&](int k, int phase) {
            for (const Block& x : b[k])
                if (x.phase < phase) return false;
            return true;
        };
        // enabled events: (kernel, block), the block's next phase
        for (;;) {
            std::vector<std::pair<int, int>> enabled;
            for (int k = 0; k < n; k++)
                for (int i = 0; i < blocks[k]; i++) {
                    const Block& x = b[k][i];
                    const StepSync& s = sync[k];
                    // kernel k launches once every block of k-1 has triggered: started (early) or past its wait
                    const bool launched = k == 0 || all_at_least(k - 1, sync[k - 1].early_trigger ? 1 : 2);
                    if (x.phase == 0 && launched) enabled.push_back({k, i});
                    else if (x.phase == 1 && (s.wait < 0 || counters[s.wait] >= s.wait_blocks))
                        enabled.push_back({k, i});
                    else if (x.phase == 2) enabled.push_back({k, i});
                }
            if (enabled.empty()) break;
            const auto [k, i] = enabled[next_rand(rng) % enabled.size()];
            Block& x = b[k][i];
            const StepSync& s = sync[k];
            if (x.phase == 1) {
                CHECK(s.early_trigger == (early_trigger && k > 0), "kernel %d's early trigger", k);
                if (s.wait >= 0) {
                    CHECK(s.wait == k - 1 && s.wait_blocks == blocks[k - 1], "kernel %d waits on %d for %d", k, s.wait,
                          s.wait_blocks);
                    CHECK(all_at_least(s.wait, 3), "step %d: kernel %d released before kernel %d counted in", step, k,
                          s.wait);
                } else {
                    CHECK(k == 0, "kernel %d of the chain has no counter to wait on", k);
                }
                if (i == 0 && s.reset0 >= 0) {
                    // zeroing is safe only if every block of that kernel counted in this step and
                    // every block waiting on it is past its wait
                    const int r = s.reset0;
                    const bool this_step = r < k;  // kernel 0 zeroes last step's counter n-2
                    if (this_step) {
                        CHECK(all_at_least(r, 3), "step %d: kernel %d zeroes counter %d before it is complete", step,
                              k, r);
                        CHECK(r + 1 >= n || all_at_least(r + 1, 2), "step %d: kernel %d zeroes counter %d while "
                              "kernel %d waits on it", step, k, r, r + 1);
                    } else {
                        CHECK(k == 0 && r == n - 2, "kernel %d zeroes counter %d of a later kernel", k, r);
                    }
                    counters[r] = 0;
                }
            }
            if (x.phase == 2 && s.arrive >= 0) {
                CHECK(s.arrive == k, "kernel %d counts into %d", k, s.arrive);
                counters[k]++;
                CHECK(counters[k] <= blocks[k], "step %d: counter %d at %d, above the %d blocks", step, k, counters[k],
                      blocks[k]);
            }
            x.phase++;
        }
        for (int k = 0; k < n; k++)
            if (!all_at_least(k, 3)) {
                CHECK(false, "step %d stalled: kernel %d of %d never finished (early trigger %d, seed %llu)", step, k,
                      n, (int)early_trigger, (unsigned long long)seed);
                return false;
            }
    }
    return true;
}

}  // namespace

int main() {
    // no chain, or one too short for the resets: every kernel keeps pdl_wait and counts nothing
    int storage[2] = {0, 0};
    StepChain none, two;
    two.counters = storage;
    two.n = 2;
    for (StepChain* c : {&none, &two}) {
        c->launched(5);
        const StepSync d = c->sync();
        CHECK(d.counters == nullptr && d.wait == -1 && d.arrive == -1 && d.reset0 == -1, "the %s chain's sync",
              c == &none ? "empty" : "2-kernel");
    }
    // the shapes of generate's chain (GPT-2 124M at B = 1: encoder 1 block, 12 x 5 kernels, lm_head) and
    // random ones, including the shortest chains
    uint64_t seed = 12345;
    int played = 0;
    for (bool early : {false, true})
        for (int n : {3, 4, 5, 7, 62}) {
            for (int trial = 0; trial < (n == 62 ? 20 : 200); trial++) {
                std::vector<int> blocks(n);
                for (int& x : blocks) x = 1 + (int)(next_rand(seed) % 4);
                if (!play(n, blocks, 3, early, seed + trial)) break;
                played++;
            }
        }
    printf("test_step_sync: %d schedules of 3 steps, %d checks, %d failures\n", played, check_count, check_failures);
    return check_failures ? 1 : 0;
}
