// test_zero: the ZeRO plan and the sharded optimizer state of llmc/zero.h, without processes.
//  - for many parameter counts and world sizes the shards tile [0, n), start on an aligned
//    element, are at most one alignment longer than n / world, and zero_for_each_piece cuts any
//    range along them;
//  - state files written as the shards of world size W (each rank's slice) read back, through
//    zero_read_state, as any slice of any other plan (world sizes 1..5, stages 0..2), element for
//    element, with the master weights; a missing or a foreign shard is refused with its reason;
//  - the data position moves across world sizes when the windows divide, and fails otherwise.
// Run: build/test_zero (a second).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "llmc/zero.h"

static int failures = 0;
#define CHECK(cond, ...)                              \
    do {                                              \
        if (!(cond)) {                                \
            failures++;                               \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                      \
            printf("\n");                             \
        }                                             \
    } while (0)

static void write_shards(const std::string& dir, int64_t n, int world, int stage) {
    mkdir(dir.c_str(), 0755);
    for (int r = 0; r < world; r++) {
        const ZeroPlan p = zero_plan(n, stage, r, world, 16);
        if (!zero_writes_state(p)) continue;
        const int64_t b = p.opt_begin(), k = p.opt_count();
        std::vector<float> m(k), v(k), master(k);
        for (int64_t i = 0; i < k; i++) m[i] = (float)(b + i), v[i] = (float)(b + i) * 2, master[i] = -(float)(b + i);
        TrainState st;
        st.step = 7;
        st.num_params = k;
        st.loader[2] = 3;
        st.loader[7] = world;
        const bool whole = k == n;
        st.shard_begin = whole ? 0 : b;
        st.total_params = whole ? 0 : n;
        state_write((dir + "/" + zero_state_file_name(p)).c_str(), st, m.data(), v.data(), master.data());
    }
}

int main() {
    // 1. plans
    for (int64_t n : {1, 7, 100, 128, 129, 1000, 4096, 12345, 1 << 20})
        for (int world = 1; world <= 9; world++) {
            int64_t covered = 0;
            for (int r = 0; r < world; r++) {
                const ZeroPlan p = zero_plan(n, 1, r, world);
                CHECK(p.shard_begin(r) == covered, "n=%lld world=%d rank %d starts at %lld, expected %lld", (long long)n,
                      world, r, (long long)p.shard_begin(r), (long long)covered);
                CHECK(p.shard_begin(r) % ZERO_ALIGN == 0 || p.shard_begin(r) == n, "unaligned shard");
                CHECK(p.shard <= (n + world - 1) / world + ZERO_ALIGN, "shard %lld too long", (long long)p.shard);
                covered = p.shard_end(r);
                CHECK(zero_plan(n, 0, r, world).opt_count() == n, "stage 0 keeps everything");
            }
            CHECK(covered == n, "n=%lld world=%d: shards cover %lld", (long long)n, world, (long long)covered);
            const ZeroPlan p = zero_plan(n, 2, 0, world);
            int64_t pieces = 0, next = n / 3;
            zero_for_each_piece(p, n / 3, n, [&](int r, int64_t lo, int64_t hi) {
                CHECK(lo == next && hi > lo && lo >= p.shard_begin(r) && hi <= p.shard_end(r), "bad piece");
                next = hi;
                pieces++;
            });
            CHECK(next == n || n / 3 == n, "pieces end at %lld of %lld", (long long)next, (long long)n);
        }
    // 2. state shards, written at one world size and read at another
    char root[] = "/tmp/test_zero_XXXXXX";
    if (!mkdtemp(root)) return 1;
    const int64_t n = 1000;
    for (int world = 1; world <= 4; world++)
        for (int stage = 0; stage <= 2; stage++) {
            const std::string dir = std::string(root) + "/w" + std::to_string(world) + "s" + std::to_string(stage);
            write_shards(dir, n, world, stage);
            for (int w2 = 1; w2 <= 5; w2++)
                for (int r2 = 0; r2 < w2; r2++) {
                    const ZeroPlan p = zero_plan(n, 2, r2, w2, 16);
                    const int64_t b = p.opt_begin(), k = p.opt_count();
                    std::vector<float> m(k, 0), v(k, 0), master(k, 0);
                    const TrainState st = zero_read_state(dir, n, b, p.opt_end(), m.data(), v.data(), master.data());
                    bool same = st.step == 7 && st.num_params == n && st.has_master == 1 && st.loader[7] == world;
                    for (int64_t i = 0; i < k; i++)
                        same &= m[i] == (float)(b + i) && v[i] == (float)(b + i) * 2 && master[i] == -(float)(b + i);
                    CHECK(same, "world %d stage %d read at rank %d of %d: wrong values", world, stage, r2, w2);
                }
        }
    {  // a missing shard: refused, naming where the gap is (run in a child: fail() exits)
        const std::string dir = std::string(root) + "/w3s1";
        remove((dir + "/state_00001.bin").c_str());
        fflush(stdout);
        if (fork() == 0) {
            if (!freopen((std::string(root) + "/gap.txt").c_str(), "w", stderr)) _exit(2);
            std::vector<float> m(n), v(n);
            zero_read_state(dir, n, 0, n, m.data(), v.data(), nullptr);
            _exit(0);
        }
        int status = 0;
        wait(&status);
        FILE* f = fopen((std::string(root) + "/gap.txt").c_str(), "r");
        char line[512] = "";
        if (f) {
            if (!fgets(line, sizeof line, f)) line[0] = 0;
            fclose(f);
        }
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1 && strstr(line, "do not tile"),
              "a missing shard is not refused: %s", line);
    }
    // 3. the data position across world sizes
    int64_t s[16] = {};
    s[1] = 2, s[2] = 6, s[7] = 2;  // epoch 2, 6 batches at 2 ranks = 12 windows
    zero_loader_state_for_world(s, 3, "test");
    CHECK(s[2] == 4 && s[7] == 3 && s[1] == 2, "12 windows at 3 ranks: %lld batches", (long long)s[2]);
    zero_loader_state_for_world(s, 1, "test");
    CHECK(s[2] == 12 && s[7] == 1, "12 windows at 1 rank: %lld batches", (long long)s[2]);
    fflush(stdout);
    if (fork() == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(2);
        zero_loader_state_for_world(s, 5, "test");  // 12 windows cannot be split 5 ways
        _exit(0);
    }
    int status = 0;
    wait(&status);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1, "12 windows at 5 ranks was accepted");
    std::string rm = std::string("rm -rf ") + root;
    if (system(rm.c_str()) != 0) printf("could not remove %s\n", root);
    printf("test_zero: %s\n", failures ? "FAILED" : "all checks passed");
    return failures ? 1 : 0;
}
