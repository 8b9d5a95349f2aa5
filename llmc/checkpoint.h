// checkpoint.h: the files of a training run, shared by both trainers (docs/formats.md,
// "Checkpoint directory"):
//   out_dir/step_NNNNNNNN/{model.bin, state.bin, DONE}
// A checkpoint is written into step_NNNNNNNN.tmp/ and renamed into place when complete, so a
// step_NNNNNNNN directory is always whole. DONE, written last, lists the step and the size and
// checksum64 of model.bin and state.bin: it ties the two files together and lets --resume tell a
// damaged checkpoint from a good one (falling back to the newest good one, and saying so).
// open_run_files does every check on the run's files at startup, before any training: --out-dir
// and --log writable (missing parents created), another run's checkpoints or log never replaced
// without --overwrite 1, leftovers of interrupted saves removed.
#pragma once
#include <dirent.h>
#include <fcntl.h>
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "llmc/formats.h"
#include "llmc/train_config.h"
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

inline std::string checkpoint_dir_name(int64_t step) {
    char name[32];
    snprintf(name, sizeof name, "step_%08lld", (long long)step);
    return name;
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

// Starts checkpoint `step` in out_dir: returns the directory to write model.bin and state.bin
// into (step_NNNNNNNN.tmp, emptied if an interrupted save left it).
inline std::string checkpoint_begin(const std::string& out_dir, int64_t step) {
    mkdirs_or_fail(out_dir, "--out-dir");
    const std::string tmp = out_dir + "/" + checkpoint_dir_name(step) + ".tmp";
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

// --init of the trainers (weights only, a fresh optimizer; --resume continues a run): a checkpoint
// directory step_NNNNNNNN means its model.bin, checked against its DONE, as is a model.bin named
// directly. A directory of checkpoints is refused: which of them, and whether to continue the run
// (--resume) or only take its weights, is the user's choice.
inline void resolve_init_path(TrainConfig& cfg) {
    struct stat st;
    if (cfg.init.empty() || stat(cfg.init.c_str(), &st) != 0) return;  // a descriptor, or a missing file
    if (S_ISDIR(st.st_mode)) {
        while (cfg.init.size() > 1 && cfg.init.back() == '/') cfg.init.pop_back();
        if (!file_exists((cfg.init + "/DONE").c_str())) {
            if (!list_checkpoints(cfg.init).empty())
                fail("--init %s: a directory of checkpoints: give one of them (%s/step_NNNNNNNN: its weights, a fresh "
                     "optimizer), or --resume %s to continue the run", cfg.init.c_str(), cfg.init.c_str(),
                     cfg.init.c_str());
            fail("--init %s: a directory, but not a checkpoint (no DONE in it): give a model .bin or a checkpoint "
                 "directory step_NNNNNNNN", cfg.init.c_str());
        }
        const std::string why = checkpoint_problem(cfg.init, CHECKPOINT_FILES[0]);
        if (!why.empty()) fail("--init %s: damaged checkpoint: %s", cfg.init.c_str(), why.c_str());
        cfg.init += std::string("/") + CHECKPOINT_FILES[0];
        return;
    }
    check_checkpoint_model(cfg.init, "--init");
}

// Removes what interrupted saves left in out_dir: step_*.tmp directories, and from earlier builds
// (which wrote in place) *.tmp files in step directories and step directories without DONE.
inline void remove_checkpoint_leftovers(const std::string& out_dir) {
    DIR* d = opendir(out_dir.c_str());
    if (!d) return;
    std::vector<std::string> doomed, stray_files;
    while (dirent* e = readdir(d)) {
        int64_t step;
        const std::string dir = out_dir + "/" + e->d_name;
        if (parse_checkpoint_name(e->d_name, &step, ".tmp")) doomed.push_back(dir);
        if (!parse_checkpoint_name(e->d_name, &step)) continue;
        if (!file_exists((dir + "/DONE").c_str())) {
            doomed.push_back(dir);
            continue;
        }
        for (const char* name : CHECKPOINT_FILES)
            if (file_exists((dir + "/" + name + ".tmp").c_str())) stray_files.push_back(dir + "/" + name + ".tmp");
    }
    closedir(d);
    for (const std::string& dir : doomed) remove_checkpoint_dir(dir);
    for (const std::string& f : stray_files) unlink(f.c_str());
    if (!doomed.empty() || !stray_files.empty())
        fprintf(stderr, "checkpoint: removed %zu leftovers of interrupted saves from %s\n",
                doomed.size() + stray_files.size(), out_dir.c_str());
}

// The --log file: every line is flushed and checked, so a full disk or /dev/full stops the run
// with an error instead of an empty log, and a killed run's log has every finished step.
class RunLog {
  public:
    RunLog() = default;
    RunLog(const RunLog&) = delete;
    RunLog& operator=(const RunLog&) = delete;
    RunLog(RunLog&& o) noexcept : f_(o.f_), path_(std::move(o.path_)) { o.f_ = nullptr; }
    RunLog& operator=(RunLog&& o) noexcept {
        if (this != &o) {
            if (f_) fclose(f_);
            f_ = o.f_;
            path_ = std::move(o.path_);
            o.f_ = nullptr;
        }
        return *this;
    }
    ~RunLog() {
        if (f_) fclose(f_);
    }
    void open(const std::string& path, bool append) {
        path_ = path;
        f_ = fopen(path.c_str(), append ? "a" : "w");
        if (!f_) fail("--log %s: cannot open for writing (%s)", path.c_str(), strerror(errno));
    }
    explicit operator bool() const { return f_ != nullptr; }
    // printf to the log (nothing when no --log), flushed at once
    __attribute__((format(printf, 2, 3))) void line(const char* fmt, ...) {
        if (!f_) return;
        va_list ap;
        va_start(ap, fmt);
        const int n = vfprintf(f_, fmt, ap);
        va_end(ap);
        if (n < 0 || fflush(f_) != 0 || ferror(f_)) fail("--log %s: write failed (%s)", path_.c_str(), strerror(errno));
    }
    void close() {
        if (!f_) return;
        FILE* f = f_;
        f_ = nullptr;
        if (fclose(f) != 0) fail("--log %s: close failed (%s)", path_.c_str(), strerror(errno));
    }

  private:
    FILE* f_ = nullptr;
    std::string path_;
};

// On --resume from step N, the lines of --log for steps after N were written by the run that was
// interrupted and are about to be written again: they are dropped (the file rewritten atomically),
// so the log holds each step once. So are step N's evaluation lines (val_loss, hellaswag): the
// resumed run evaluates at its first step again. Lines that do not start with "step <n>" are kept.
inline void trim_log_after(const std::string& path, int64_t step) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;  // missing, or /dev/null and the like
    FILE* f = fopen(path.c_str(), "r");
    if (!f) return;
    std::string kept, line;
    int64_t dropped = 0;
    char buf[4096];
    while (fgets(buf, sizeof buf, f)) {
        line += buf;
        if (line.back() != '\n' && !feof(f)) continue;  // a line longer than buf
        long long n;
        char what[32];
        const int got = sscanf(line.c_str(), "step %lld %31s", &n, what);
        if (got >= 1 && (n > step || (n == step && got == 2 && strcmp(what, "train_loss") != 0))) dropped++;
        else kept += line;
        line.clear();
    }
    fclose(f);
    if (dropped == 0) return;
    AtomicFileWriter w(path);
    w.write(kept.data(), kept.size());
    w.commit();
    fprintf(stderr, "log: dropped %lld lines of %s after the checkpoint's step %lld (this run writes them again)\n",
            (long long)dropped, path.c_str(), (long long)step);
}

// With a checkpoint to resume: the model comes from its model.bin, and without --out-dir the run
// keeps writing beside it.
inline void resume_paths(TrainConfig& cfg, const std::string& resume_from) {
    cfg.init = resume_from + "/model.bin";
    if (cfg.out_dir.empty()) {
        const size_t slash = resume_from.find_last_of('/');
        cfg.out_dir = slash == std::string::npos ? "." : resume_from.substr(0, slash);
    }
}

struct RunFiles {
    std::string resume_from;  // the checkpoint directory to load; "" for a fresh run
    RunLog log;               // --log (closed when not given)
};

// Everything about the run's files, called once after the flags are parsed and before any work:
//  - stdout becomes line-buffered, so a redirected run that is killed keeps its finished lines;
//  - --init: a checkpoint directory becomes its model.bin, and a checkpoint's model.bin is verified;
//  - --resume: finds the checkpoint (falling back past damaged ones), checks that --init only
//    repeats its shape, and sets cfg.init to its model.bin and cfg.out_dir (if not given) to its
//    directory;
//  - --out-dir: created with its parents and checked writable; leftovers of interrupted saves are
//    removed; checkpoints of another run (a fresh run) or newer than the one resumed are an error
//    unless --overwrite 1, which deletes them;
//  - --log: parents created, opened (on --resume appending, after dropping the lines past the
//    checkpoint's step); another run's log is an error on a fresh run unless --overwrite 1.
inline RunFiles open_run_files(TrainConfig& cfg) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    for (std::string* dir : {&cfg.resume_dir, &cfg.out_dir})  // "out/" names the same as "out"
        while (dir->size() > 1 && dir->back() == '/') dir->pop_back();
    RunFiles files;
    int64_t resume_step = -1;
    std::vector<std::string> damaged;
    resolve_init_path(cfg);  // a checkpoint directory to --init: its model.bin, verified
    if (!cfg.resume_dir.empty()) {
        files.resume_from = checkpoint_find(cfg.resume_dir, "--resume", &damaged);
        const std::string model_path = files.resume_from + "/model.bin";
        if (!cfg.init.empty()) {  // --init may only repeat the checkpoint's model shape
            const ModelConfig have = model_read_info(model_path.c_str()).config;
            const bool is_file = file_exists(cfg.init.c_str());
            ModelConfig want = is_file ? model_read_info(cfg.init.c_str()).config
                                      : model_config_from_descriptor(cfg.init.c_str());
            // Every field a descriptor holds is compared, a field it leaves out by its default. The
            // window and the context are not descriptor fields, nor is NKV when --kv-heads is given:
            // apply_shape_flags checks those flags against the checkpoint.
            if (!is_file) {
                want.window = have.window;
                want.max_seq_len = have.max_seq_len;
                if (cfg.kv_heads >= 0) want.num_kv_heads = have.num_kv_heads;
            }
            if (!model_same_config(have, want))
                fail("--init %s: differs from the model of the checkpoint %s (L=%d C=%d NH=%d NKV=%d W=%d); with "
                     "--resume the model comes from the checkpoint, so drop --init or repeat the run's own",
                     cfg.init.c_str(), files.resume_from.c_str(), have.num_layers, have.channels, have.num_heads,
                     have.num_kv_heads, have.window);
        }
        resume_paths(cfg, files.resume_from);
        const std::vector<std::string> states = zero_list_state_files(files.resume_from);  // state.bin or shards
        if (states.empty()) fail("--resume %s: the checkpoint has no state.bin", files.resume_from.c_str());
        resume_step = state_read_header((files.resume_from + "/" + states[0]).c_str()).step;
    }
    if (!cfg.out_dir.empty()) {
        mkdirs_or_fail(cfg.out_dir, "--out-dir");
        const std::string probe = cfg.out_dir + "/.write_test.tmp";
        int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) fail("--out-dir %s: cannot write there (%s)", cfg.out_dir.c_str(), strerror(errno));
        close(fd);
        unlink(probe.c_str());
        remove_checkpoint_leftovers(cfg.out_dir);
        std::vector<CheckpointEntry> in_the_way;
        for (const CheckpointEntry& c : list_checkpoints(cfg.out_dir)) {
            const bool is_damaged = std::find(damaged.begin(), damaged.end(), c.dir) != damaged.end();
            if (c.step > resume_step && !is_damaged) in_the_way.push_back(c);
        }
        if (!in_the_way.empty() && !cfg.overwrite) {
            const std::string& newest = in_the_way.back().dir;
            if (resume_step < 0)
                fail("--out-dir %s: holds %zu checkpoints of another run (newest %s): --resume %s continues it, "
                     "--overwrite 1 deletes them, or choose another --out-dir", cfg.out_dir.c_str(), in_the_way.size(),
                     newest.c_str(), cfg.out_dir.c_str());
            fail("--resume %s: --out-dir %s holds %zu checkpoints newer than step %lld (newest %s) that this run would "
                 "replace: --overwrite 1 deletes them, or choose another --out-dir", files.resume_from.c_str(),
                 cfg.out_dir.c_str(), in_the_way.size(), (long long)resume_step, newest.c_str());
        }
        // newest first: a run killed while deleting leaves the older ones without a gap, so a later
        // --resume of the directory continues from the newest that is left (oldest first left a hole,
        // and the next --resume picked up the newest checkpoint of the timeline being replaced)
        for (auto c = in_the_way.rbegin(); c != in_the_way.rend(); ++c) remove_checkpoint_dir(c->dir);
        if (!in_the_way.empty())
            fprintf(stderr, "checkpoint: --overwrite 1: deleted %zu checkpoints from %s\n", in_the_way.size(),
                    cfg.out_dir.c_str());
    }
    if (!cfg.log_path.empty()) {
        const size_t slash = cfg.log_path.find_last_of('/');
        if (slash != std::string::npos && slash > 0) mkdirs_or_fail(cfg.log_path.substr(0, slash), "--log");
        struct stat st;
        const bool resuming = resume_step >= 0;
        if (!resuming && !cfg.overwrite && stat(cfg.log_path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
            // a fresh run gets here only when --out-dir holds no complete checkpoint: nothing there to --resume
            if (!cfg.out_dir.empty())
                fail("--log %s: holds another run's log, and --out-dir %s no complete checkpoint to resume it from "
                     "(a run stopped before its first): --overwrite 1 replaces the log, or choose another --log",
                     cfg.log_path.c_str(), cfg.out_dir.c_str());
            fail("--log %s: holds another run's log: --resume appends to it, --overwrite 1 replaces it, or choose "
                 "another --log", cfg.log_path.c_str());
        }
        const bool done = cfg.steps > 0 && resume_step >= cfg.steps;  // nothing to train, nothing rewritten
        if (resuming && !done) trim_log_after(cfg.log_path, resume_step);
        files.log.open(cfg.log_path, resuming);
    }
    return files;
}

// open_run_files for the other ranks of a data-parallel run (llmc/dist.h): rank 0 alone checks and
// prepares the files (and logs); the others take the checkpoint it found, and touch nothing.
inline RunFiles follow_run_files(TrainConfig& cfg, const std::string& resume_from) {
    RunFiles files;
    files.resume_from = resume_from;
    if (!resume_from.empty()) resume_paths(cfg, resume_from);
    return files;
}

// The check after every optimizer step: a loss or gradient norm that is NaN or infinite means the
// run diverged (and the update just spread it into the weights), so it stops before the next
// checkpoint is written; the checkpoints already in --out-dir are the last good ones.
inline void check_step_finite(int64_t step, double loss, double grad_norm, const std::string& out_dir) {
    if (std::isfinite(loss) && std::isfinite(grad_norm)) return;
    fail("step %lld: the %s is %g: training diverged, stopping without writing a checkpoint%s%s (resume from the last "
         "good one with a lower --lr or --grad-clip)", (long long)step, std::isfinite(loss) ? "gradient norm" : "loss",
         std::isfinite(loss) ? grad_norm : loss, out_dir.empty() ? "" : "; the checkpoints in ",
         out_dir.empty() ? "" : (out_dir + " are kept").c_str());
}

// The --steps check once the total is known: a checkpoint past it is an error, one at it has
// nothing left to train (said, not silent).
inline void check_steps_left(int64_t start_step, int64_t total_steps, const std::string& resume_from) {
    if (start_step > total_steps)
        fail("--steps %lld: the checkpoint %s is already at step %lld; give --steps above it to train on",
             (long long)total_steps, resume_from.c_str(), (long long)start_step);
    if (start_step == total_steps && start_step > 0)
        fprintf(stderr, "nothing to train: the checkpoint %s is already at step %lld = --steps\n",
                resume_from.c_str(), (long long)start_step);
}
