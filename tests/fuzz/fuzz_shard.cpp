// fuzz_shard: the token shard reader (GPTD, llmc/formats.h) and the DataLoader over it
// (llmc/dataloader.h), as the trainers use them: a few (B, T, rank, world_size, shuffle) settings,
// more than an epoch of batches, and a save_state/load_state round trip.
// Invariants: the file is the header, the ids and (version 3) one mask byte a token; every input and
// target id of a batch is below the model's vocab_size; targets are the inputs shifted by one; every
// mask value is 0 or 1 (all 1 without a mask); a resumed loader yields the same next batch as the original.
#include <vector>
#include "llmc/dataloader.h"
#include "tests/fuzz/fuzz_common.h"

struct LoaderSetting {
    int B, T, rank, world_size, vocab_size;
    bool shuffle;
};

static void check_batch(const DataLoader& dl, const LoaderSetting& s) {
    const int64_t BT = (int64_t)s.B * s.T;
    for (int64_t j = 0; j < BT; j++) {
        FUZZ_CHECK(dl.inputs()[j] >= 0 && dl.inputs()[j] < s.vocab_size);
        FUZZ_CHECK(dl.targets()[j] >= 0 && dl.targets()[j] < s.vocab_size);
        if (j + 1 < BT) FUZZ_CHECK(dl.targets()[j] == dl.inputs()[j + 1]);
        FUZZ_CHECK(dl.mask()[j] == 1 || (dl.has_mask() && dl.mask()[j] == 0));
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static MemFile file("shard.bin");
    const char* path = file.set(data, size);
    try {
        ShardInfo info = shard_read_info(path);
        FUZZ_CHECK((int64_t)size == HEADER_BYTES + (info.token_bytes + (info.has_mask ? 1 : 0)) * info.num_tokens);
    } catch (const FailError&) {
        return 0;
    }
    static const LoaderSetting settings[] = {
        {1, 1, 0, 1, 65536, false}, {2, 3, 1, 2, 50257, true}, {1, 4, 0, 3, 256, true}};
    for (const LoaderSetting& s : settings) {
        try {
            DataLoader dl(path, s.B, s.T, s.rank, s.world_size, s.vocab_size, 1337, s.shuffle);
            const int64_t steps = std::min<int64_t>(dl.num_windows() + 2, 64);
            int64_t state[16];
            for (int64_t i = 0; i < steps; i++) {
                if (i == steps / 2) dl.save_state(state);
                dl.next_batch();
                check_batch(dl, s);
            }
            DataLoader resumed(path, s.B, s.T, s.rank, s.world_size, s.vocab_size, 1337, s.shuffle);
            resumed.load_state(state);
            dl.load_state(state);
            dl.next_batch();
            resumed.next_batch();
            const int64_t BT = (int64_t)s.B * s.T;
            FUZZ_CHECK(std::equal(dl.inputs(), dl.inputs() + BT, resumed.inputs()));
        } catch (const FailError&) {
        }
    }
    return 0;
}
