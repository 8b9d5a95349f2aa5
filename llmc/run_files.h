// run_files.h: the files of a training run at its start, shared by both trainers: the checkpoint to
// resume, the model to load, --out-dir and --log. open_run_files checks them all before any training:
// writable (missing parents created), another run's checkpoints or log never replaced without
// --overwrite 1, leftovers of interrupted saves removed. The messages name the flags (run_file_settings).
#pragma once
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include "llmc/checkpoint.h"
#include "llmc/checkpoint_read.h"
#include "llmc/dist.h"
#include "llmc/formats.h"
#include "llmc/model_config.h"
#include "llmc/utils.h"
#include "llmc/zero.h"

struct RunFileSettings {
    std::string init;             // --init: a model file, a checkpoint directory or a descriptor ("" = none given)
    std::string resume_dir;       // --resume: a checkpoint, or a directory of them ("" = a fresh run)
    std::string out_dir;          // --out-dir ("" = none; on --resume, the checkpoint's directory)
    std::string log_path;         // --log ("" = none)
    bool overwrite = false;       // --overwrite 1: another run's checkpoints and log may be replaced
    bool kv_heads_given = false;  // --kv-heads given: NKV is the caller's to check against the checkpoint
    int64_t steps = -1;           // --steps (-1 = one epoch): a resume at or past it rewrites no log line
    int optimizer = OPTIMIZER_ADAMW;  // --optimizer: the state of a checkpoint to resume must be this one's
};

// --init of the trainers (weights only, a fresh optimizer; --resume continues a run): a checkpoint
// directory step_NNNNNNNN means its model.bin, checked against its DONE, as is a model.bin named
// directly. A directory of checkpoints is refused: which of them, and whether to continue the run
// (--resume) or only take its weights, is the user's choice. Returns the model to load: the file, or
// `init` itself (a descriptor, or a missing file that the model reader names).
inline std::string resolve_init_path(std::string init) {
    struct stat st;
    if (init.empty() || stat(init.c_str(), &st) != 0) return init;
    if (S_ISDIR(st.st_mode)) {
        while (init.size() > 1 && init.back() == '/') init.pop_back();
        if (!file_exists((init + "/DONE").c_str())) {
            if (!list_checkpoints(init).empty())
                fail("--init %s: a directory of checkpoints: give one of them (%s/step_NNNNNNNN: its weights, a fresh "
                     "optimizer), or --resume %s to continue the run", init.c_str(), init.c_str(), init.c_str());
            fail("--init %s: a directory, but not a checkpoint (no DONE in it): give a model .bin or a checkpoint "
                 "directory step_NNNNNNNN", init.c_str());
        }
        const std::string why = checkpoint_problem(init, CHECKPOINT_FILES[0]);
        if (!why.empty()) fail("--init %s: damaged checkpoint: %s", init.c_str(), why.c_str());
        return init + "/" + CHECKPOINT_FILES[0];
    }
    check_checkpoint_model(init, "--init");
    return init;
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
    void open(const std::string& path, bool append) {
        path_ = path;
        f_.reset(fopen(path.c_str(), append ? "a" : "w"));
        if (!f_) fail("--log %s: cannot open for writing (%s)", path.c_str(), strerror(errno));
    }
    // printf to the log (nothing when no --log), flushed at once
    __attribute__((format(printf, 2, 3))) void line(const char* fmt, ...) {
        if (!f_) return;
        va_list ap;
        va_start(ap, fmt);
        const int n = vfprintf(f_.get(), fmt, ap);
        va_end(ap);
        if (n < 0 || fflush(f_.get()) != 0 || ferror(f_.get()))
            fail("--log %s: write failed (%s)", path_.c_str(), strerror(errno));
    }
    void close() {
        if (f_ && fclose(f_.release()) != 0) fail("--log %s: close failed (%s)", path_.c_str(), strerror(errno));
    }

  private:
    UniqueFile f_;  // checked by close(); a log not closed is closed unchecked
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

struct RunFiles {
    std::string resume_from;  // the checkpoint directory to load; "" for a fresh run
    std::string init;         // the model to load: a model file (a checkpoint's model.bin) or a descriptor
    std::string out_dir;      // where checkpoints go ("" = none): --out-dir, else on --resume the checkpoint's directory
    RunLog log;               // --log (closed when not given)
};

// --resume: the checkpoint (falling back past damaged ones, listed in *damaged), checked against
// --init, which may only repeat its model's shape, and against --optimizer, which must be the one its
// state was written by; the model then comes from its model.bin, and without --out-dir the run keeps
// writing beside it. Returns the checkpoint's step.
inline int64_t find_resume_checkpoint(const std::string& resume_dir, bool kv_heads_given, int optimizer,
                                      RunFiles& files, std::vector<std::string>* damaged) {
    files.resume_from = checkpoint_find(resume_dir, "--resume", damaged);
    const std::string model_path = files.resume_from + "/" + CHECKPOINT_FILES[0];
    if (!files.init.empty()) {
        const ModelConfig have = model_read_info(model_path.c_str()).config;
        const bool is_file = file_exists(files.init.c_str());
        ModelConfig want = is_file ? model_read_info(files.init.c_str()).config
                                   : model_config_from_descriptor(files.init.c_str());
        // Every field a descriptor holds is compared, a field it leaves out by its default. The
        // window and the context are not descriptor fields, nor is NKV when --kv-heads is given:
        // apply_shape_flags checks those flags against the checkpoint.
        if (!is_file) {
            want.window = have.window;
            want.max_seq_len = have.max_seq_len;
            if (kv_heads_given) want.num_kv_heads = have.num_kv_heads;
        }
        if (!model_same_config(have, want))
            fail("--init %s: differs from the model of the checkpoint %s (L=%d C=%d NH=%d NKV=%d W=%d); with "
                 "--resume the model comes from the checkpoint, so drop --init or repeat the run's own",
                 files.init.c_str(), files.resume_from.c_str(), have.num_layers, have.channels, have.num_heads,
                 have.num_kv_heads, have.window);
    }
    files.init = model_path;
    if (files.out_dir.empty()) {
        const size_t slash = files.resume_from.find_last_of('/');
        files.out_dir = slash == std::string::npos ? "." : files.resume_from.substr(0, slash);
    }
    const std::vector<std::string> states = zero_list_state_files(files.resume_from);  // state.bin or shards
    if (states.empty()) fail("--resume %s: the checkpoint has no state.bin", files.resume_from.c_str());
    const TrainState st = state_read_header((files.resume_from + "/" + states[0]).c_str());
    if (st.optimizer != optimizer)
        fail("--optimizer %s: the checkpoint %s holds %s's optimizer state; resume it with --optimizer %s, or take "
             "only its weights with --init %s (a fresh optimizer)", optimizer_name(optimizer),
             files.resume_from.c_str(), optimizer_name((int)st.optimizer), optimizer_name((int)st.optimizer),
             files.resume_from.c_str());
    return st.step;
}

// --out-dir: created with its parents and checked writable; leftovers of interrupted saves removed;
// checkpoints of another run (a fresh run, resume_step < 0) or newer than the one resumed are an
// error unless --overwrite 1, which deletes them (the damaged ones --resume skipped are left).
inline void prepare_out_dir(const std::string& out_dir, const RunFiles& files, int64_t resume_step, bool overwrite,
                            const std::vector<std::string>& damaged) {
    mkdirs_or_fail(out_dir, "--out-dir");
    const std::string probe = out_dir + "/.write_test.tmp";
    int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) fail("--out-dir %s: cannot write there (%s)", out_dir.c_str(), strerror(errno));
    close(fd);
    unlink(probe.c_str());
    remove_checkpoint_leftovers(out_dir);
    std::vector<CheckpointEntry> in_the_way;
    for (const CheckpointEntry& c : list_checkpoints(out_dir)) {
        const bool is_damaged = std::find(damaged.begin(), damaged.end(), c.dir) != damaged.end();
        if (c.step > resume_step && !is_damaged) in_the_way.push_back(c);
    }
    if (!in_the_way.empty() && !overwrite) {
        const std::string& newest = in_the_way.back().dir;
        if (resume_step < 0)
            fail("--out-dir %s: holds %zu checkpoints of another run (newest %s): --resume %s continues it, "
                 "--overwrite 1 deletes them, or choose another --out-dir", out_dir.c_str(), in_the_way.size(),
                 newest.c_str(), out_dir.c_str());
        fail("--resume %s: --out-dir %s holds %zu checkpoints newer than step %lld (newest %s) that this run would "
             "replace: --overwrite 1 deletes them, or choose another --out-dir", files.resume_from.c_str(),
             out_dir.c_str(), in_the_way.size(), (long long)resume_step, newest.c_str());
    }
    // newest first: a run killed while deleting leaves the older ones without a gap, so a later
    // --resume continues from the newest left, never from the timeline being replaced
    for (auto c = in_the_way.rbegin(); c != in_the_way.rend(); ++c) remove_checkpoint_dir(c->dir);
    if (!in_the_way.empty())
        fprintf(stderr, "checkpoint: --overwrite 1: deleted %zu checkpoints from %s\n", in_the_way.size(),
                out_dir.c_str());
}

// --log: parents created, opened (on --resume appending, after dropping the lines past the
// checkpoint's step); another run's log is an error on a fresh run unless --overwrite 1.
inline void open_log(const RunFileSettings& s, RunFiles& files, int64_t resume_step) {
    const std::string& path = s.log_path;
    const size_t slash = path.find_last_of('/');
    if (slash != std::string::npos && slash > 0) mkdirs_or_fail(path.substr(0, slash), "--log");
    struct stat st;
    const bool resuming = resume_step >= 0;
    if (!resuming && !s.overwrite && stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        // a fresh run gets here only when --out-dir holds no complete checkpoint: nothing there to --resume
        if (!files.out_dir.empty())
            fail("--log %s: holds another run's log, and --out-dir %s no complete checkpoint to resume it from "
                 "(a run stopped before its first): --overwrite 1 replaces the log, or choose another --log",
                 path.c_str(), files.out_dir.c_str());
        fail("--log %s: holds another run's log: --resume appends to it, --overwrite 1 replaces it, or choose "
             "another --log", path.c_str());
    }
    const bool done = s.steps > 0 && resume_step >= s.steps;  // nothing to train, nothing rewritten
    if (resuming && !done) trim_log_after(path, resume_step);
    files.log.open(path, resuming);
}

// Everything about the run's files, called once after the flags are parsed and before any work:
// stdout becomes line-buffered (a redirected run that is killed keeps its finished lines); --init's
// checkpoint directory becomes its model.bin, verified; then --resume, --out-dir and --log as above.
inline RunFiles open_run_files(const RunFileSettings& s) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    auto trimmed = [](std::string dir) {  // "out/" names the same as "out"
        while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
        return dir;
    };
    RunFiles files;
    files.init = resolve_init_path(s.init);
    files.out_dir = trimmed(s.out_dir);
    int64_t resume_step = -1;
    std::vector<std::string> damaged;
    if (!s.resume_dir.empty())
        resume_step = find_resume_checkpoint(trimmed(s.resume_dir), s.kv_heads_given, s.optimizer, files, &damaged);
    if (!files.out_dir.empty()) prepare_out_dir(files.out_dir, files, resume_step, s.overwrite, damaged);
    if (!s.log_path.empty()) open_log(s, files, resume_step);
    return files;
}

// open_run_files for a data-parallel run: rank 0 alone checks, prepares and logs; the others take
// the checkpoint it found, its --out-dir and the model file it resolved, and touch nothing.
inline RunFiles dist_open_run_files(const RunFileSettings& s, Comm& comm) {
    RunFiles files;
    if (comm.primary()) files = open_run_files(s);
    comm.broadcast(files.resume_from, 0);
    comm.broadcast(files.out_dir, 0);
    comm.broadcast(files.init, 0);
    return files;
}

// After every optimizer step: a NaN or infinite loss or gradient norm means the run diverged (and the
// update spread it into the weights): stop before the next checkpoint, keeping the last good ones.
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
