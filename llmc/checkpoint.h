// checkpoint.h: the checkpoint directory layout both trainers share (docs/design.md):
//   out_dir/step_NNNNNNNN/{model.bin, state.bin, DONE}
// model.bin and state.bin each go through AtomicFileWriter; DONE is written last, so a directory
// without it is an interrupted save and is never resumed from.
#pragma once
#include <dirent.h>
#include <cerrno>
#include <cstring>
#include <string>
#include "llmc/utils.h"

// Creates out_dir and its step directory; returns the step directory.
inline std::string checkpoint_begin(const std::string& out_dir, int64_t step) {
    char name[32];
    snprintf(name, sizeof name, "step_%08lld", (long long)step);
    mkdir_or_fail(out_dir.c_str());
    const std::string dir = out_dir + "/" + name;
    mkdir_or_fail(dir.c_str());
    return dir;
}

// Marks a checkpoint complete, after its files are written.
inline void checkpoint_finish(const std::string& dir) {
    AtomicFileWriter done(dir + "/DONE");
    done.write("ok\n", 3);
    done.commit();
    printf("checkpoint: wrote %s\n", dir.c_str());
}

// The checkpoint to resume from: `path` itself if it holds DONE, else its newest complete step_*.
inline std::string checkpoint_find(const std::string& path) {
    if (file_exists((path + "/DONE").c_str())) return path;
    DIR* d = opendir(path.c_str());
    if (!d) fail("--resume %s: cannot open the directory (%s)", path.c_str(), strerror(errno));
    std::string best;
    long long best_step = -1;
    while (dirent* e = readdir(d)) {
        long long step;
        char tail;
        if (sscanf(e->d_name, "step_%lld%c", &step, &tail) != 1 || step <= best_step) continue;
        const std::string dir = path + "/" + e->d_name;
        if (!file_exists((dir + "/DONE").c_str())) continue;
        best = dir;
        best_step = step;
    }
    closedir(d);
    if (best.empty()) fail("--resume %s: no complete checkpoint (a step_NNNNNNNN directory with DONE) in it", path.c_str());
    return best;
}
