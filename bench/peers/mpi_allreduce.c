/*
 * Peer benchmark: Open MPI's MPI_Allreduce (float32, MPI_SUM, in place), timed as `kolo bench
 * allreduce --anchor-schedule` times kolo's, so the two can be compared.
 *
 * Per size: one checked allreduce (rank r contributes r+1; every element must equal
 * n(n+1)/2), the buffer zeroed, W warm-up operations, then I timed operations, each
 *   MPI_Barrier; t0; MPI_Allreduce(MPI_IN_PLACE, ...); t1
 * with the per-operation time taken as the maximum over ranks (reduced after t1).
 * Reported: median, min, p10, p90, max; algbw = bytes / median; busbw = algbw * 2(n-1)/n
 * (GB = 1e9 bytes). Schedule (W/I): <=64 KiB 20/200, <=1 MiB 10/100, <=16 MiB 3/30, else 2/20.
 *
 * Usage: mpirun -np N mpi_allreduce [SIZE_BYTES ...]   (default 4 KiB 64 KiB 1 MiB 16 MiB 64 MiB)
 * Output: one JSON object per size on rank 0's stdout.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int compareTimes(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of a sorted array, q in [0, 1]. */
static double percentile(const double *sorted, int count, double q) {
  int index = (int)(q * (count - 1) + 0.5);
  if (index < 0) index = 0;
  if (index > count - 1) index = count - 1;
  return sorted[index];
}

static void schedule(size_t bytes, int *warmup, int *iters) {
  if (bytes <= ((size_t)64 << 10)) { *warmup = 20; *iters = 200; }
  else if (bytes <= ((size_t)1 << 20)) { *warmup = 10; *iters = 100; }
  else if (bytes <= ((size_t)16 << 20)) { *warmup = 3; *iters = 30; }
  else { *warmup = 2; *iters = 20; }
}

static void runSize(size_t bytes, int rank, int np) {
  const size_t count = bytes / sizeof(float);
  float *data = malloc(count ? count * sizeof(float) : 1);
  for (size_t i = 0; i < count; i++) data[i] = (float)(rank + 1);

  MPI_Allreduce(MPI_IN_PLACE, data, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const float want = (float)(np * (np + 1) / 2);
  int wrong = 0, anyWrong = 0;
  for (size_t i = 0; i < count && !wrong; i++) wrong = data[i] != want;
  MPI_Allreduce(&wrong, &anyWrong, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  memset(data, 0, count * sizeof(float));

  int warmup, iters;
  schedule(bytes, &warmup, &iters);
  for (int i = 0; i < warmup; i++) MPI_Allreduce(MPI_IN_PLACE, data, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);

  double *times = malloc(sizeof(double) * iters);
  for (int i = 0; i < iters; i++) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, data, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double elapsed = MPI_Wtime() - start;
    MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    times[i] = elapsed;
  }
  if (rank == 0) {
    qsort(times, iters, sizeof(double), compareTimes);
    const double median = iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);
    const double algbw = (double)bytes / median / 1e9;
    const double busbw = algbw * 2.0 * (np - 1) / np;
    printf("{\"bench\":\"mpi_allreduce\",\"impl\":\"openmpi\",\"np\":%d,\"dtype\":\"f32\",\"op\":\"sum\","
           "\"inplace\":true,\"bytes\":%zu,\"count\":%zu,\"warmup\":%d,\"iters\":%d,\"t_median_us\":%.3f,"
           "\"t_min_us\":%.3f,\"t_p10_us\":%.3f,\"t_p90_us\":%.3f,\"t_max_us\":%.3f,\"algbw_GBps\":%.4f,"
           "\"busbw_GBps\":%.4f,\"correct\":%s}\n",
           np, bytes, count, warmup, iters, median * 1e6, times[0] * 1e6, percentile(times, iters, 0.1) * 1e6,
           percentile(times, iters, 0.9) * 1e6, times[iters - 1] * 1e6, algbw, busbw, anyWrong ? "false" : "true");
    fflush(stdout);
  }
  free(times);
  free(data);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, np;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  const size_t defaults[] = {(size_t)4 << 10, (size_t)64 << 10, (size_t)1 << 20, (size_t)16 << 20, (size_t)64 << 20};
  if (argc > 1) {
    for (int i = 1; i < argc; i++) runSize((size_t)strtoull(argv[i], NULL, 10), rank, np);
  } else {
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++) runSize(defaults[i], rank, np);
  }
  MPI_Finalize();
  return 0;
}
