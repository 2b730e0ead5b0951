/*
 * memcpy bound for the allreduce comparison, the "memcpy, 1 thread" figure: two
 * page-touched, 4 KiB-aligned buffers of SIZE MiB (default 64), 3 warm-up copies, then ITERS
 * timed glibc memcpy calls on one core; payload GB/s = bytes / median time (GB = 1e9 bytes).
 *
 * Usage: memcpy_bw [SIZE_MIB] [ITERS]     Output: one JSON object.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int compareTimes(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  const size_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 64;
  const int iters = argc > 2 ? atoi(argv[2]) : 30;
  const size_t bytes = mib << 20;
  char *src = NULL, *dst = NULL;
  if (iters < 1 || posix_memalign((void **)&src, 4096, bytes) || posix_memalign((void **)&dst, 4096, bytes)) {
    fprintf(stderr, "memcpy_bw: bad arguments or out of memory\n");
    return 1;
  }
  memset(src, 1, bytes);
  memset(dst, 0, bytes);
  double *times = malloc(sizeof(double) * iters);
  for (int i = 0; i < 3 + iters; i++) {
    const double start = seconds();
    memcpy(dst, src, bytes);
    const double elapsed = seconds() - start;
    if (i >= 3) times[i - 3] = elapsed;
  }
  qsort(times, iters, sizeof(double), compareTimes);
  const double median = iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);
  printf("{\"bench\":\"memcpy_bw\",\"kernel\":\"memcpy\",\"threads\":1,\"bytes\":%zu,\"iters\":%d,"
         "\"t_median_us\":%.1f,\"payload_GBps\":%.3f,\"ok\":%s}\n",
         bytes, iters, median * 1e6, bytes / median / 1e9, dst[bytes - 1] == 1 ? "true" : "false");
  free(times);
  free(src);
  free(dst);
  return 0;
}
