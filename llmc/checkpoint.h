// checkpoint.h: writing the checkpoints of a training run, shared by both trainers (docs/formats.md,
// "Checkpoint directory"; the readers, and what DONE lists, are llmc/checkpoint_read.h's):
//   out_dir/step_NNNNNNNN/{model.bin, state.bin, DONE}
// A checkpoint is written into step_NNNNNNNN.tmp/ and renamed into place when complete, so a
// step_NNNNNNNN directory is always whole; DONE, written last, ties its files together.
#pragma once
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "llmc/checkpoint_read.h"
#include "llmc/utils.h"
#include "llmc/zero.h"

// fsync a directory, so a rename inside it survives a power cut; errors are ignored (some
// filesystems refuse to fsync a directory, and the data files themselves are already synced).
inline void fsync_dir(const std::string& dir) {
    int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd < 0) return;
    fsync(fd);
    close(fd);
}

// Deletes a checkpoint directory: renamed to <dir>.tmp first (atomic), so an interruption leaves
// a leftover that the next start removes, never a half-deleted directory that looks complete.
// Only the files inside are removed; a subdirectory someone put there keeps the directory.
inline void remove_checkpoint_dir(const std::string& dir) {
    std::string doomed = dir;
    if (doomed.size() < 4 || doomed.compare(doomed.size() - 4, 4, ".tmp") != 0) {
        doomed = dir + ".tmp";
        remove_checkpoint_dir(doomed);  // an older leftover under that name
        if (rename(dir.c_str(), doomed.c_str()) != 0) {
            if (errno == ENOENT) return;
            fail("%s: cannot remove (rename failed: %s)", dir.c_str(), strerror(errno));
        }
    }
    DIR* d = opendir(doomed.c_str());
    if (!d) return;
    while (dirent* e = readdir(d)) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        const std::string path = doomed + "/" + e->d_name;
        struct stat st;
        if (lstat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) unlink(path.c_str());
    }
    closedir(d);
    if (rmdir(doomed.c_str()) != 0)
        fprintf(stderr, "checkpoint: could not remove %s (%s)\n", doomed.c_str(), strerror(errno));
}

// Starts checkpoint `step` in out_dir: returns the directory to write model.bin and state.bin
// into (step_NNNNNNNN.tmp, emptied if an interrupted save left it).
inline std::string checkpoint_begin(const std::string& out_dir, int64_t step) {
    mkdirs_or_fail(out_dir, "--out-dir");
    char name[32];
    snprintf(name, sizeof name, "step_%08lld.tmp", (long long)step);
    const std::string tmp = out_dir + "/" + name;
    remove_checkpoint_dir(tmp);
    mkdir_or_fail(tmp.c_str());
    return tmp;
}

// Completes the checkpoint begun in `tmp_dir`: writes DONE (the manifest, from the files as they
// are on disk) and renames the directory to its final name. A checkpoint of the same step already
// there (a resumed run retracing its steps) is swapped out atomically where the filesystem can
// (renameat2 RENAME_EXCHANGE), else removed just before the rename.
inline void checkpoint_finish(const std::string& tmp_dir) {
    const bool is_tmp = tmp_dir.size() > 4 && tmp_dir.compare(tmp_dir.size() - 4, 4, ".tmp") == 0;
    const std::string dir = is_tmp ? tmp_dir.substr(0, tmp_dir.size() - 4) : tmp_dir;
    const size_t slash = dir.find_last_of('/');
    int64_t step;
    if (!is_tmp || !parse_checkpoint_name(dir.c_str() + (slash == std::string::npos ? 0 : slash + 1), &step))
        fail("internal: checkpoint_finish(%s): not a directory from checkpoint_begin", tmp_dir.c_str());
    std::string manifest = std::string(CHECKPOINT_MANIFEST) + "\nstep " + std::to_string(step) + "\n";
    std::vector<std::string> files = zero_list_state_files(tmp_dir);  // state.bin, or the ranks' shards
    files.insert(files.begin(), CHECKPOINT_FILES[0]);
    for (const std::string& name : zero_list_state_files(tmp_dir, is_fp8_state_file)) files.push_back(name);
    for (const std::string& name : files) {
        const std::string path = tmp_dir + "/" + name;
        int64_t size;
        uint64_t sum;
        if (!file_checksum64(path.c_str(), &size, &sum)) fail("%s: cannot read it back (%s)", path.c_str(), strerror(errno));
        char entry[128];
        snprintf(entry, sizeof entry, "%s %lld %016llx\n", name.c_str(), (long long)size, (unsigned long long)sum);
        manifest += entry;
    }
    AtomicFileWriter done(tmp_dir + "/DONE");
    done.write(manifest.data(), manifest.size());
    done.commit();
    fsync_dir(tmp_dir);
    if (renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
        remove_checkpoint_dir(tmp_dir);  // now holds the replaced checkpoint
    } else {
        if (file_exists(dir.c_str())) remove_checkpoint_dir(dir);
        if (rename(tmp_dir.c_str(), dir.c_str()) != 0)
            fail("%s: cannot rename %s to it (%s)", dir.c_str(), tmp_dir.c_str(), strerror(errno));
    }
    fsync_dir(slash == std::string::npos ? "." : dir.substr(0, slash));
    printf("checkpoint: wrote %s\n", dir.c_str());
}
