// dist_mpi.h: the MPI process group (class Comm of llmc/dist.h over MPI_COMM_WORLD), compiled only
// in MPI builds (-DLLMC_MPI, with mpicxx: build/train_gpt2_cpu_mpi, or make USE_MPI=1 for the GPU).
// llmc/dist.h includes it; elsewhere this header is empty, so a plain build links no MPI.
//   allreduce_sum       MPI_Allreduce(MPI_IN_PLACE, MPI_SUM)
//   reduce_sum          MPI_Reduce to the root (MPI_IN_PLACE there when recv is send)
//   allgather           MPI_Allgatherv(MPI_IN_PLACE) of the shards
// A failing rank calls MPI_Abort (fail_hook), which stops every rank; mpirun ends the job when a
// rank dies. MPI counts are ints: a shard of 2^31 floats or more is refused (a CPU run that large
// is not realistic; the GPU's gradients go over NCCL).
#pragma once
#ifdef LLMC_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only (the C++ bindings warn under -Wextra)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <climits>
#include <vector>
#include "llmc/utils.h"
#include "llmc/zero.h"

class MpiComm : public Comm {
  public:
    MpiComm(int* argc, char*** argv) {
        int inited = 0;
        MPI_Initialized(&inited);
        if (!inited && MPI_Init(argc, argv) != MPI_SUCCESS) fail("--dist-init mpi: MPI_Init failed");
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        MPI_Comm node;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, &local_rank);
        MPI_Comm_free(&node);
        how = "mpi";
        fail_hook = [] { MPI_Abort(MPI_COMM_WORLD, 1); };
    }
    ~MpiComm() override { finish(); }
    void finish() override {
        int done = 0;
        MPI_Finalized(&done);
        if (!done) MPI_Finalize();
        fail_hook = nullptr;
    }
    void allreduce_sum(float* x, int64_t n) override {
        for (int64_t i = 0; i < n; i += INT_MAX / 2)
            MPI_Allreduce(MPI_IN_PLACE, x + i, count(std::min<int64_t>(n - i, INT_MAX / 2)), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
    }
    void allreduce_sum(double* x, int64_t n) override {
        MPI_Allreduce(MPI_IN_PLACE, x, count(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    void reduce_sum(const float* send, float* recv, int64_t n, int root) override {
        const void* from = rank == root && recv == send ? MPI_IN_PLACE : (const void*)send;
        MPI_Reduce(from, recv, count(n), MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD);
    }
    void allgather(float* x, const ZeroPlan& p) override {
        std::vector<int> counts(world), displs(world);
        for (int r = 0; r < world; r++) {
            counts[r] = count(p.shard_end(r) - p.shard_begin(r));
            displs[r] = count(p.shard_begin(r));
        }
        MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, counts.data(), displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
    }
    void broadcast(void* x, int64_t bytes, int root) override {
        MPI_Bcast(x, count(bytes), MPI_BYTE, root, MPI_COMM_WORLD);
    }
    void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }

  private:
    static int count(int64_t n) {
        if (n > INT_MAX) fail("--dist-init mpi: a message of %lld elements is beyond MPI's int counts", (long long)n);
        return (int)n;
    }
};
#endif
