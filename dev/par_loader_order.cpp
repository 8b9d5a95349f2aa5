// par_loader_order.cpp: prints the first n training batches llmc/dataloader.h yields (shuffled, rank 0
// of 1), one line each: `batch k tokens t0 t1 t2 t3 sum` (the first four input ids and the sum of all
// B*T input ids), for comparison with dev/par_ref_train.py's --order llmc.
//   g++ -O2 -std=c++17 -I. dev/par_loader_order.cpp -o /tmp/par_loader_order
//   /tmp/par_loader_order "data/*_train_*.bin" B T seed n
#include <cstdio>
#include <cstdlib>
#include "llmc/dataloader.h"

int main(int argc, char** argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s GLOB B T SEED N\n", argv[0]);
        return 1;
    }
    const int B = atoi(argv[2]), T = atoi(argv[3]), n = atoi(argv[5]);
    DataLoader d(argv[1], B, T, 0, 1, 1 << 20, strtoull(argv[4], nullptr, 10), true);
    for (int k = 0; k < n; k++) {
        d.next_batch();
        long long sum = 0;
        for (int i = 0; i < B * T; i++) sum += d.inputs()[i];
        const int* x = d.inputs();
        printf("batch %d tokens %d %d %d %d %lld\n", k, x[0], x[1], x[2], x[3], sum);
    }
    return 0;
}
