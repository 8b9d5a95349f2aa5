// dist.h: the process group of a data-parallel run (docs/distributed.md): who the ranks are, how
// they found each other, and the host-side collectives over it. One process per rank (on the GPU,
// one GPU per process). C++17, no CUDA; both trainers use it.
//
// How the ranks meet (--dist-init, else found from the environment):
//   mpi               MPI_Init; rank and size from MPI (builds with LLMC_MPI: make USE_MPI=1 and
//                     build/train_gpt2_cpu_mpi; launched by mpirun, or srun --mpi=pmix);
//   tcp://HOST:PORT   rank 0 listens on PORT, the others connect to HOST:PORT; rank and world size
//                     from --rank/--world-size, else RANK/WORLD_SIZE (torchrun's), else
//                     SLURM_PROCID/SLURM_STEP_NUM_TASKS (srun), else OMPI_COMM_WORLD_RANK/SIZE (mpirun);
//   file:/shared/dir  as tcp, with rank 0's address published in /shared/dir/llmc_rendezvous;
//   env               tcp://$MASTER_ADDR:$MASTER_PORT (torchrun's variables);
//   none              one process.
// Without --dist-init: an MPI build started by an MPI launcher uses mpi, WORLD_SIZE > 1 means env,
// and a run started as one of several tasks without a way to meet them (mpirun of a build without
// MPI, srun with several tasks) is an error rather than several copies of one run.
//
// Failures never hang: every wait of the tcp group has a deadline (--dist-timeout seconds), a rank
// that exits or dies closes its sockets and its peers stop at once naming it, and a mismatched
// world size is refused at the rendezvous. Under MPI a failing rank calls MPI_Abort (fail_hook).
//
// The collectives (class Comm) work on host buffers (the GPU's tensors go over NCCL,
// llmc/model_dist.cuh). The tcp group routes them through rank 0 (a star), which sums in rank
// order: simple and exact.
#pragma once
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include "llmc/utils.h"
#include "llmc/zero.h"

class Comm {
  public:
    int rank = 0, world = 1;
    int local_rank = 0;           // the rank among this node's processes: its GPU
    std::string how = "single process";
    virtual ~Comm() = default;
    virtual void allreduce_sum(float* x, int64_t n) = 0;
    virtual void allreduce_sum(double* x, int64_t n) = 0;
    // the sum over the ranks of send[0, n) arrives in recv[0, n) at rank `root` (a ZeRO-2 bucket's
    // piece, to its owner's shard); recv is not touched on the other ranks, and may be send
    virtual void reduce_sum(const float* send, float* recv, int64_t n, int root) = 0;
    // rank r's slice x[shard_begin(r), shard_end(r)) goes to every rank
    virtual void allgather(float* x, const ZeroPlan& p) = 0;
    virtual void broadcast(void* x, int64_t bytes, int root) = 0;
    virtual void barrier() = 0;
    virtual void finish() {}  // the run ends normally
    bool primary() const { return rank == 0; }
    double allreduce_sum(double x) {
        allreduce_sum(&x, 1);
        return x;
    }
    void broadcast(std::string& s, int root) {
        int64_t len = (int64_t)s.size();
        broadcast(&len, sizeof len, root);
        s.resize((size_t)len);
        if (len) broadcast(&s[0], len, root);
    }
};

class LocalComm : public Comm {
  public:
    void allreduce_sum(float*, int64_t) override {}
    void allreduce_sum(double*, int64_t) override {}
    void reduce_sum(const float* send, float* recv, int64_t n, int) override {
        if (recv != send) std::copy(send, send + n, recv);
    }
    void allgather(float*, const ZeroPlan&) override {}
    void broadcast(void*, int64_t, int) override {}
    void barrier() override {}
};

namespace dist_detail {
inline double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

inline int env_int(const char* name, int fallback) {
    const char* v = getenv(name);
    int64_t x;
    if (!v || !*v) return fallback;
    if (!parse_int64(v, &x) || x < 0 || x > (1 << 20)) fail("environment variable %s=%s: not a rank or a world size", name, v);
    return (int)x;
}
inline bool env_set(const char* name) { return getenv(name) && *getenv(name); }

// The first of several (rank, size) environment pairs that is set. Slurm's is the job step's task
// count (srun sets it), not SLURM_NTASKS, which a batch script also has for its one process.
struct RankSource {
    int rank = -1, world = -1, local_rank = -1;
    std::string from;
};
inline RankSource ranks_from_env() {
    static const char* const pairs[][4] = {{"RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK/WORLD_SIZE"},
                                           {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_PROCID/SLURM_STEP_NUM_TASKS"},
                                           {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                            "OMPI_COMM_WORLD_RANK/SIZE"}};
    for (const auto& p : pairs)
        if (env_set(p[0]) && env_set(p[1])) return {env_int(p[0], -1), env_int(p[1], -1), env_int(p[2], -1), p[3]};
    return {};
}

// ------------------------------------------------------------------------ sockets with deadlines
struct Peer {
    int fd = -1;
    int rank = -1;
};

class Link {
  public:
    Link(int timeout_s, std::string what) : timeout_(timeout_s), what_(std::move(what)) {}
    // Waits until fd is ready for `events` or fails naming the peer.
    void wait(const Peer& p, short events, const char* doing) const {
        pollfd pfd{p.fd, events, 0};
        const double deadline = now_s() + timeout_;
        for (;;) {
            const int left_ms = (int)std::max(0.0, (deadline - now_s()) * 1000.0);
            const int r = poll(&pfd, 1, std::min(left_ms, 1000));
            if (r > 0) return;
            if (r < 0 && errno != EINTR) fail("%s: poll failed (%s)", what_.c_str(), strerror(errno));
            if (now_s() >= deadline)
                fail("%s: %s sent nothing for %d s while %s (--dist-timeout); is it stuck or gone?", what_.c_str(),
                     who(p).c_str(), timeout_, doing);
        }
    }
    void send(const Peer& p, const void* data, int64_t bytes, const char* doing) const {
        transfer(p, (char*)data, bytes, true, doing);
    }
    void recv(const Peer& p, void* data, int64_t bytes, const char* doing) const {
        transfer(p, (char*)data, bytes, false, doing);
    }
    // All `bytes` to or from peer p, in pieces of at most 16 MiB, each after wait() says the socket is ready.
    void transfer(const Peer& p, char* c, int64_t bytes, bool out, const char* doing) const {
        while (bytes > 0) {
            wait(p, out ? POLLOUT : POLLIN, doing);
            const size_t piece = (size_t)std::min<int64_t>(bytes, 1 << 24);
            const ssize_t n = out ? ::send(p.fd, c, piece, MSG_NOSIGNAL) : ::recv(p.fd, c, piece, 0);
            if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            if (n <= 0)
                fail("%s: lost the connection to %s while %s (%s): it exited or died; see its error", what_.c_str(),
                     who(p).c_str(), doing, n < 0 ? strerror(errno) : "closed");
            c += n;
            bytes -= n;
        }
    }
    static std::string who(const Peer& p) { return p.rank < 0 ? "a joining process" : "rank " + std::to_string(p.rank); }

  private:
    int timeout_;
    std::string what_;
};

struct Hello {
    char magic[8] = {'L', 'L', 'M', 'C', 'D', 'I', 'S', 'T'};
    int32_t version = 1, rank = 0, world = 0, status = 0;  // status: 0 = ok (reply), else the reply carries why
    char why[240] = {};
};

inline void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Splits "HOST:PORT" (the part after tcp://); fails naming the flag.
inline void parse_host_port(const std::string& spec, const std::string& flag, std::string* host, int* port) {
    const size_t colon = spec.find_last_of(':');
    int64_t p;
    if (colon == std::string::npos || colon == 0 || !parse_int64(spec.c_str() + colon + 1, &p) || p < 1 || p > 65535)
        fail("%s: expected tcp://HOST:PORT with a port in [1, 65535]", flag.c_str());
    *host = spec.substr(0, colon);
    *port = (int)p;
}

// A listening socket on PORT (0: any free port) of every interface; returns the fd, *port the port.
inline int listen_on(int* port, const std::string& flag) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail("%s: socket failed (%s)", flag.c_str(), strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons((uint16_t)*port);
    if (bind(fd, (sockaddr*)&a, sizeof a) != 0)
        fail("%s: rank 0 cannot listen on port %d (%s): another run may hold it; choose another port", flag.c_str(),
             *port, strerror(errno));
    if (listen(fd, 1024) != 0) fail("%s: listen failed (%s)", flag.c_str(), strerror(errno));
    socklen_t len = sizeof a;
    getsockname(fd, (sockaddr*)&a, &len);
    *port = ntohs(a.sin_port);
    return fd;
}

// One connection attempt with a deadline; returns the fd, or -1 with *why set.
inline int try_connect(const std::string& host, int port, double seconds, std::string* why) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    const int g = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (g != 0) {
        *why = std::string("cannot resolve ") + host + ": " + gai_strerror(g);
        return -1;
    }
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int rc = connect(fd, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (rc != 0 && errno == EINPROGRESS) {
        pollfd pfd{fd, POLLOUT, 0};
        rc = poll(&pfd, 1, (int)(seconds * 1000));
        int err = 0;
        socklen_t len = sizeof err;
        if (rc == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (rc == 1 && err == 0) rc = 0;
        else {
            errno = rc == 0 ? ETIMEDOUT : err;
            rc = -1;
        }
    }
    if (rc != 0) {
        *why = strerror(errno);
        close(fd);
        return -1;
    }
    return fd;
}
}  // namespace dist_detail

// The tcp:// and file: process group: a star of sockets around rank 0.
class TcpComm : public Comm {
  public:
    // host "" with a rendezvous file: rank 0 publishes its address in `file_dir`/llmc_rendezvous
    TcpComm(const std::string& flag, const std::string& host, int port, const std::string& file_dir, int rank_,
            int world_, int local_rank_, int timeout_s)
        : link_(timeout_s, "--dist-init " + flag) {
        using namespace dist_detail;
        snprintf(fail_tag, sizeof fail_tag, "rank %d: ", rank_);
        rank = rank_;
        world = world_;
        local_rank = local_rank_;
        how = flag;
        const std::string what = "--dist-init " + flag;
        const std::string published = file_dir.empty() ? "" : file_dir + "/llmc_rendezvous";
        const double deadline = now_s() + timeout_s;
        if (rank == 0) {
            int p = port;
            const int lfd = listen_on(&p, what);
            if (!published.empty()) {
                char name[256] = {};
                gethostname(name, sizeof name - 1);
                const std::string line = std::string(name) + " " + std::to_string(p) + "\n";
                AtomicFileWriter w(published);
                w.write(line.data(), line.size());
                w.commit();
            }
            peers_.resize(world);
            int joined = 0;
            while (joined < world - 1) {
                pollfd pfd{lfd, POLLIN, 0};
                const int left_ms = (int)std::max(0.0, (deadline - now_s()) * 1000.0);
                if (poll(&pfd, 1, std::min(left_ms, 1000)) <= 0) {
                    if (now_s() < deadline) continue;
                    std::string missing;
                    for (int r = 1; r < world; r++)
                        if (peers_[r].fd < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
                    refuse_all("not every rank joined in time");
                    fail("%s: %d of the %d other ranks joined within %d s (--dist-timeout); missing rank(s) %s",
                         what.c_str(), joined, world - 1, timeout_s, missing.c_str());
                }
                const int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
                if (fd < 0) continue;
                set_nodelay(fd);
                Hello h{};
                Peer tmp{fd, -1};
                link_.recv(tmp, &h, sizeof h, "joining");
                char why[240] = "";
                if (memcmp(h.magic, Hello().magic, 8) != 0 || h.version != 1)
                    snprintf(why, sizeof why, "a connection that is not an llmc rank of this build");
                else if (h.world != world)
                    snprintf(why, sizeof why, "rank %d was started with world size %d, rank 0 with %d: every rank "
                             "needs the same world size", h.rank, h.world, world);
                else if (h.rank <= 0 || h.rank >= world)
                    snprintf(why, sizeof why, "a rank %d joined, outside [1, %d)", h.rank, world);
                else if (peers_[h.rank].fd >= 0)
                    snprintf(why, sizeof why, "two processes both claim rank %d", h.rank);
                if (*why) {
                    reply(fd, 1, why);
                    close(fd);
                    refuse_all(why);
                    fail("%s: %s", what.c_str(), why);
                }
                peers_[h.rank] = {fd, h.rank};
                joined++;
            }
            close(lfd);
            for (int r = 1; r < world; r++) reply(peers_[r].fd, 0, "");
            if (!published.empty()) unlink(published.c_str());
        } else {
            std::string why = "no attempt";
            int fd = -1;
            while (fd < 0) {
                std::string h = host;
                int p = port;
                if (!published.empty() && !read_published(published, &h, &p)) why = published + " not written yet";
                else fd = try_connect(h, p, std::min(2.0, std::max(0.1, deadline - now_s())), &why);
                if (fd >= 0) break;
                if (now_s() >= deadline)
                    fail("%s: could not reach rank 0 within %d s (--dist-timeout): %s", what.c_str(), timeout_s,
                         why.c_str());
                std::this_thread::sleep_for(std::chrono::milliseconds(200));
            }
            set_nodelay(fd);
            root_ = {fd, 0};
            Hello h;
            h.rank = rank;
            h.world = world;
            link_.send(root_, &h, sizeof h, "joining");
            link_.recv(root_, &h, sizeof h, "waiting for the other ranks to join");
            if (h.status != 0) fail("%s: rank 0 refused the rendezvous: %s", what.c_str(), h.why);
        }
    }
    ~TcpComm() override { finish(); }
    void finish() override {
        for (dist_detail::Peer& p : peers_)
            if (p.fd >= 0) close(p.fd), p.fd = -1;
        if (root_.fd >= 0) close(root_.fd), root_.fd = -1;
    }

    void allreduce_sum(float* x, int64_t n) override { reduce_then(x, n, -1, "summing over the ranks"); }
    void allreduce_sum(double* x, int64_t n) override { reduce_then(x, n, -1, "summing over the ranks"); }
    void reduce_sum(const float* send, float* recv, int64_t n, int root) override {
        scratch_.assign(send, send + n);
        reduce_then(scratch_.data(), n, root, "reducing to one rank");
        if (rank == root) std::copy(scratch_.begin(), scratch_.end(), recv);
    }
    void allgather(float* x, const ZeroPlan& p) override {
        if (rank == 0) {
            for (int r = 1; r < world; r++)
                link_.recv(peers_[r], x + p.shard_begin(r), bytes_of(x, p.shard_end(r) - p.shard_begin(r)), "gathering");
            for (int r = 1; r < world; r++) link_.send(peers_[r], x, bytes_of(x, p.n), "gathering");
        } else {
            link_.send(root_, x + p.shard_begin(rank), bytes_of(x, p.shard_end(rank) - p.shard_begin(rank)), "gathering");
            link_.recv(root_, x, bytes_of(x, p.n), "gathering");
        }
    }
    void broadcast(void* x, int64_t bytes, int root) override {
        if (rank == 0) {
            if (root != 0) link_.recv(peers_[root], x, bytes, "broadcasting");
            for (int r = 1; r < world; r++)
                if (r != root) link_.send(peers_[r], x, bytes, "broadcasting");
        } else if (rank == root) {
            link_.send(root_, x, bytes, "broadcasting");
        } else {
            link_.recv(root_, x, bytes, "broadcasting");
        }
    }
    void barrier() override {
        char b = 0;
        reduce_then(&b, 1, -1, "at a barrier");  // one byte to rank 0 and back
    }

  private:
    template <typename T>
    static int64_t bytes_of(const T*, int64_t n) { return n * (int64_t)sizeof(T); }

    // Sums x over the ranks at rank 0 (in rank order, so the result does not depend on timing),
    // then sends the sum to every rank (to = -1) or to rank `to` alone (the others' x is left as it
    // was, except rank 0's, which holds the sum).
    template <typename T>
    void reduce_then(T* x, int64_t n, int to, const char* doing) {
        if (rank == 0) {
            constexpr int64_t CHUNK = 1 << 20;
            std::vector<T> tmp((size_t)std::min(n, CHUNK));
            for (int r = 1; r < world; r++)
                for (int64_t i = 0; i < n; i += CHUNK) {
                    const int64_t k = std::min(CHUNK, n - i);
                    link_.recv(peers_[r], tmp.data(), bytes_of(x, k), doing);
                    for (int64_t j = 0; j < k; j++) x[i + j] += tmp[j];
                }
            for (int r = 1; r < world; r++)
                if (to < 0 || to == r) link_.send(peers_[r], x, bytes_of(x, n), doing);
        } else {
            link_.send(root_, x, bytes_of(x, n), doing);
            if (to < 0 || to == rank) link_.recv(root_, x, bytes_of(x, n), doing);
        }
    }
    void reply(int fd, int status, const char* why) const {
        dist_detail::Hello h;
        h.status = status;
        snprintf(h.why, sizeof h.why, "%s", why);
        ::send(fd, &h, sizeof h, MSG_NOSIGNAL);
    }
    void refuse_all(const char* why) {
        for (dist_detail::Peer& p : peers_)
            if (p.fd >= 0) reply(p.fd, 1, why), close(p.fd), p.fd = -1;
    }
    static bool read_published(const std::string& path, std::string* host, int* port) {
        FILE* f = fopen(path.c_str(), "r");
        if (!f) return false;
        char h[256];
        const bool ok = fscanf(f, "%255s %d", h, port) == 2;
        fclose(f);
        if (ok) *host = h;
        return ok;
    }

    dist_detail::Link link_;
    std::vector<dist_detail::Peer> peers_;  // rank 0: one per other rank
    std::vector<float> scratch_;             // reduce_sum's working copy
    dist_detail::Peer root_;                // the others: rank 0
};

#ifdef LLMC_MPI
#include "llmc/dist_mpi.h"
#endif

// The data-parallel settings of a run, from the trainers' flags (llmc/train_config.h), which the
// messages name.
struct DistSettings {
    std::string how;      // --dist-init: mpi | tcp://HOST:PORT | file:DIR | env | none ("" = from the environment)
    int timeout_s = 600;  // --dist-timeout: seconds any rank waits for another before failing
    int rank = -1;        // --rank for tcp/file (-1 = from the environment)
    int world_size = -1;  // --world-size for tcp/file (-1 = from the environment)
    int zero = 0;         // --zero: 0 all-reduce, 1 optimizer state sharded, 2 gradients too (llmc/zero.h)
};

// Sets up the process group the settings and the environment ask for (see the top of this file).
// Rank 0 alone prints: the others' stdout goes to /dev/null (their errors still reach stderr,
// tagged with the rank).
inline std::unique_ptr<Comm> dist_init(const DistSettings& settings, int* argc = nullptr, char*** argv = nullptr) {
    using namespace dist_detail;
    std::string spec = settings.how;
    if (spec.empty()) {
        const RankSource env = ranks_from_env();
#ifdef LLMC_MPI
        if (env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMI_SIZE") || env_set("PMIX_RANK")) spec = "mpi";
#endif
        if (spec.empty() && env_set("WORLD_SIZE") && env_int("WORLD_SIZE", 1) > 1) spec = "env";
        if (spec.empty() && env.world > 1)
            fail("this process is one of %d tasks (%s) but has no way to meet the others: give --dist-init "
                 "tcp://HOST:PORT (rank 0's host), file:/shared/dir, or use an MPI build (build/train_gpt2_cpu_mpi; the GPU "
                 "trainer with make USE_MPI=1)",
                 env.world, env.from.c_str());
        if (spec.empty()) spec = "none";
    }
    std::unique_ptr<Comm> comm;
    if (spec == "none") {
        if (settings.world_size > 1)
            fail("--world-size %d: needs --dist-init (how the ranks meet)", settings.world_size);
        comm.reset(new LocalComm());
    } else if (spec == "mpi") {
#ifdef LLMC_MPI
        comm.reset(new MpiComm(argc, argv));
        if (settings.world_size >= 0 && settings.world_size != comm->world)
            fail("--world-size %d: mpirun started %d ranks", settings.world_size, comm->world);
        if (settings.rank >= 0 && settings.rank != comm->rank)
            fail("--rank %d: MPI says this is rank %d", settings.rank, comm->rank);
#else
        (void)argc;
        (void)argv;
        fail("--dist-init mpi: this binary was built without MPI (build/train_gpt2_cpu_mpi, or make USE_MPI=1 for the "
             "GPU); or use --dist-init tcp://HOST:PORT");
#endif
    } else {
        std::string host, dir, flag = spec;
        int port = 0;
        if (spec == "env") {
            if (!env_set("MASTER_ADDR") || !env_set("MASTER_PORT"))
                fail("--dist-init env: needs MASTER_ADDR and MASTER_PORT (rank 0's host and a free port)");
            flag = "tcp://" + std::string(getenv("MASTER_ADDR")) + ":" + getenv("MASTER_PORT");
        }
        if (flag.compare(0, 6, "tcp://") == 0) parse_host_port(flag.substr(6), "--dist-init " + flag, &host, &port);
        else if (flag.compare(0, 5, "file:") == 0 && flag.size() > 5) dir = flag.substr(5);
        else fail("--dist-init %s: expected mpi, tcp://HOST:PORT, file:/shared/dir, env or none", spec.c_str());
        RankSource s = ranks_from_env();
        if (settings.rank >= 0) s.rank = settings.rank, s.from = "--rank";
        if (settings.world_size >= 0) s.world = settings.world_size, s.from = "--world-size";
        if (s.rank < 0 || s.world < 1)
            fail("--dist-init %s: the rank and world size are not known: give --rank and --world-size, or set RANK and "
                 "WORLD_SIZE (torchrun's variables), or launch with srun", spec.c_str());
        if (s.rank >= s.world) fail("--rank %d: must be below the world size %d", s.rank, s.world);
        if (s.local_rank < 0) s.local_rank = s.rank;
        if (s.world == 1) {
            comm.reset(new LocalComm());
            comm->how = flag + " (one rank)";
        } else {
            comm.reset(new TcpComm(flag, host, port, dir, s.rank, s.world, s.local_rank, settings.timeout_s));
        }
    }
    if (comm->world > 1) snprintf(fail_tag, sizeof fail_tag, "rank %d: ", comm->rank);
    if (comm->rank != 0 && !freopen("/dev/null", "w", stdout)) fail("cannot redirect stdout to /dev/null");
    return comm;
}

// One check that the ranks agree on something they each derived (e.g. the number of parameters),
// so a rank launched with other flags fails at once instead of corrupting the sums.
inline void dist_check_same(Comm& comm, int64_t value, const char* what) {
    if (comm.world == 1) return;
    int64_t first = value;
    comm.broadcast(&first, sizeof first, 0);
    const double differ = comm.allreduce_sum(value != first ? 1.0 : 0.0);
    if (differ > 0)
        fail("the ranks disagree on %s (rank 0: %lld, this rank: %lld; %d rank(s) differ from rank 0): start every rank "
             "with the same flags and files", what, (long long)first, (long long)value, (int)differ);
}
