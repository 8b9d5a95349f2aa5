// checkpoint_read.h: reading the checkpoints of a training run (docs/formats.md, "Checkpoint
// directory") for every program that loads one (the trainers' --resume and --init, generate's --model):
//   out_dir/step_NNNNNNNN/{model.bin, state.bin, DONE}
// DONE, written last, lists the step and the size and checksum64 of model.bin and the state files:
// checkpoint_problem verifies a checkpoint against it, and checkpoint_find picks the newest one that
// verifies (naming and skipping damaged newer ones). The writers are llmc/checkpoint.h's.
#pragma once
#include <dirent.h>
#include <sys/stat.h>
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "llmc/formats.h"
#include "llmc/utils.h"
#include "llmc/zero.h"

constexpr const char* CHECKPOINT_MANIFEST = "llmc-checkpoint 1";
constexpr const char* CHECKPOINT_FILES[2] = {"model.bin", "state.bin"};

// The FP8 scaling state of an --fp8 run's checkpoint (llmc/formats.h, GPT8): fp8.bin from one
// process, fp8_RRRRR.bin from rank R of a data-parallel run (each rank casts its own activations and
// gradients, so each has its own amaxes). Optional: a bf16 run writes none.
inline std::string fp8_state_file_name(int rank, int world) {
    if (world <= 1) return "fp8.bin";
    char name[32];
    snprintf(name, sizeof name, "fp8_%05d.bin", rank);
    return name;
}
inline bool is_fp8_state_file(const char* name) {
    if (strcmp(name, "fp8.bin") == 0) return true;
    if (strncmp(name, "fp8_", 4) != 0) return false;
    int digits = 0;
    for (const char* c = name + 4; *c >= '0' && *c <= '9'; c++) digits++;
    return digits >= 5 && strcmp(name + 4 + digits, ".bin") == 0;
}
// The FP8 state rank `rank` resumes from in checkpoint `dir`: its own, else rank 0's or the one of a
// one-process run (a resume at another world size); "" if the checkpoint has none.
inline std::string fp8_state_file_to_read(const std::string& dir, int rank) {
    for (const std::string& name : {fp8_state_file_name(rank, 2), fp8_state_file_name(0, 2), fp8_state_file_name(0, 1)})
        if (file_exists((dir + "/" + name).c_str())) return dir + "/" + name;
    return "";
}

// True if `name` is a checkpoint directory name, step_<digits>, optionally followed by `suffix`.
inline bool parse_checkpoint_name(const char* name, int64_t* step, const char* suffix = "") {
    if (strncmp(name, "step_", 5) != 0) return false;
    const char* p = name + 5;
    const char* digits = p;
    while (*p >= '0' && *p <= '9') p++;
    if (p == digits || p - digits > 18 || strcmp(p, suffix) != 0) return false;
    *step = strtoll(digits, nullptr, 10);
    return true;
}

// The complete checkpoints (step directories holding DONE) of `out_dir`, oldest first.
struct CheckpointEntry {
    int64_t step;
    std::string dir;
};
inline std::vector<CheckpointEntry> list_checkpoints(const std::string& out_dir) {
    std::vector<CheckpointEntry> found;
    DIR* d = opendir(out_dir.c_str());
    if (!d) return found;
    while (dirent* e = readdir(d)) {
        int64_t step;
        const std::string dir = out_dir + "/" + e->d_name;
        if (parse_checkpoint_name(e->d_name, &step) && file_exists((dir + "/DONE").c_str())) found.push_back({step, dir});
    }
    closedir(d);
    std::sort(found.begin(), found.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step < b.step; });
    return found;
}

// Why the checkpoint in `dir` cannot be used, or "" if it verifies: DONE's step must match the
// directory's name (when that is step_NNNNNNNN), each file its recorded size and checksum. A DONE
// from before checksums ("ok") is accepted unverified, so checkpoints of earlier builds still load.
// With `only` (a file name), the manifest is checked whole but only that file is read and checksummed
// (a model.bin loaded for its weights alone).
inline std::string checkpoint_problem(const std::string& dir, const char* only = nullptr) {
    FILE* f = fopen((dir + "/DONE").c_str(), "r");
    if (!f) return std::string("DONE: ") + strerror(errno);
    std::vector<std::string> lines;
    char buf[256];
    while (lines.size() < (1u << 20) && fgets(buf, sizeof buf, f)) lines.push_back(buf);
    fclose(f);
    if (lines.size() == 1 && lines[0] == "ok\n") {
        for (const char* name : CHECKPOINT_FILES)
            if ((!only || strcmp(name, only) == 0) && !file_exists((dir + "/" + name).c_str()))
                return std::string(name) + " is missing";
        return "";
    }
    if (lines.size() < 4 || lines[0] != std::string(CHECKPOINT_MANIFEST) + "\n") return "DONE is not a checkpoint manifest";
    long long step;
    if (sscanf(lines[1].c_str(), "step %lld", &step) != 1) return "DONE has no step";
    const size_t slash = dir.find_last_of('/');
    int64_t named_step;
    if (parse_checkpoint_name(dir.c_str() + (slash == std::string::npos ? 0 : slash + 1), &named_step) &&
        step != named_step)
        return "DONE is for step " + std::to_string(step) + ", not the directory's";
    // model.bin, then the optimizer state: state.bin, or one state_RRRRR.bin per rank (llmc/zero.h),
    // then an --fp8 run's fp8.bin or fp8_RRRRR.bin files
    int states = 0;
    for (size_t i = 2; i < lines.size(); i++) {
        char name[64];
        long long want_size;
        unsigned long long want_sum;
        const bool parsed = sscanf(lines[i].c_str(), "%63s %lld %llx", name, &want_size, &want_sum) == 3;
        const bool is_state = parsed && i > 2 && zero_is_state_file(name);
        states += is_state;
        if (!parsed || (i == 2 ? strcmp(name, CHECKPOINT_FILES[0]) != 0 : !is_state && (states == 0 || !is_fp8_state_file(name))))
            return std::string("DONE has no entry for ") + (i == 2 ? CHECKPOINT_FILES[0] : CHECKPOINT_FILES[1]);
        if (only && strcmp(name, only) != 0) continue;
        const std::string path = dir + "/" + name;
        int64_t size;
        uint64_t sum;
        if (!file_checksum64(path.c_str(), &size, &sum)) return std::string(name) + ": " + strerror(errno);
        if (size != want_size)
            return std::string(name) + " has " + std::to_string(size) + " bytes, DONE says " + std::to_string(want_size);
        if (sum != want_sum) return std::string(name) + " does not match the checksum in DONE";
    }
    return "";
}

// The checkpoint to load: `path` itself if it is one (holds DONE), else the newest step_* in it that
// verifies; damaged newer ones are named in a note, skipped, and listed in *damaged. `flag` is the
// flag that gave `path` ("--resume", "--model"), named in the messages.
inline std::string checkpoint_find(const std::string& path, const char* flag,
                                   std::vector<std::string>* damaged = nullptr) {
    if (file_exists((path + "/DONE").c_str())) {
        const std::string why = checkpoint_problem(path);
        if (!why.empty()) fail("%s %s: damaged checkpoint: %s", flag, path.c_str(), why.c_str());
        return path;
    }
    struct stat st;
    if (stat(path.c_str(), &st) != 0) fail("%s %s: cannot open the directory (%s)", flag, path.c_str(), strerror(errno));
    if (!S_ISDIR(st.st_mode)) fail("%s %s: not a directory (a checkpoint is one: DIR/step_NNNNNNNN)", flag, path.c_str());
    std::vector<CheckpointEntry> all = list_checkpoints(path);
    std::vector<std::string> problems;  // of the damaged ones, newest first: notes on stderr, or one error
    for (size_t i = all.size(); i-- > 0;) {
        const std::string why = checkpoint_problem(all[i].dir);
        if (why.empty()) {
            for (size_t k = 0; k < problems.size(); k++)
                fprintf(stderr, "checkpoint: %s is damaged (%s); trying the next older one\n",
                        all[all.size() - 1 - k].dir.c_str(), problems[k].c_str());
            if (i + 1 < all.size())
                fprintf(stderr, "checkpoint: %s %s instead\n",
                        strcmp(flag, "--resume") == 0 ? "resuming from" : "loading", all[i].dir.c_str());
            return all[i].dir;
        }
        problems.push_back(why);
        if (damaged) damaged->push_back(all[i].dir);
    }
    if (all.empty()) fail("%s %s: no complete checkpoint (a step_NNNNNNNN directory with DONE) in it", flag, path.c_str());
    fail("%s %s: all %zu checkpoints in it are damaged (the newest, %s: %s)", flag, path.c_str(), all.size(),
         all.back().dir.c_str(), problems[0].c_str());
}

// A model file given by `flag` (--init, --model): a model.bin inside a checkpoint directory (one
// holding DONE) is checked against DONE first, so a damaged one is refused as --resume would refuse
// its checkpoint; only model.bin is read (its weights are all that is loaded). Other files load as they are.
inline void check_checkpoint_model(const std::string& path, const char* flag) {
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
    if (path.substr(slash == std::string::npos ? 0 : slash + 1) != CHECKPOINT_FILES[0] ||
        !file_exists((dir + "/DONE").c_str()))
        return;
    const std::string why = checkpoint_problem(dir, CHECKPOINT_FILES[0]);
    if (!why.empty()) fail("%s %s: damaged checkpoint %s: %s", flag, path.c_str(), dir.c_str(), why.c_str());
}
