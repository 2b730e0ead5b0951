// A rank program for the hang-diagnosis tests, started under `kolo run`: every rank runs
// 6 all-reduces of 1000 floats, and one rank misbehaves at collective K:
//   hang_program ok                  every rank runs them all
//   hang_program skip RANK K         RANK skips all-reduce #K and then sleeps (a rank busy elsewhere)
//   hang_program mismatch RANK K     RANK calls #K with 1001 elements instead of 1000
//   hang_program stop RANK K         RANK stops itself (SIGSTOP) before #K
//   hang_program mixed               also a broadcast, a non-blocking all-reduce, a barrier, and
//                                    blocking and non-blocking sends and receives around the
//                                    ring; then writes the flight recorder (reason "end")
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kolo/comm/init.h"
#include "kolo/flight_recorder.h"
#include "kolo/trace.h"

int main(int argc, char** argv) try {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  const int badRank = argc > 2 ? std::atoi(argv[2]) : -1;
  const int badSeq = argc > 3 ? std::atoi(argv[3]) : -1;
  auto comm = kolo::comm::initFromEnvironment();
  const bool bad = comm->rank() == badRank;
  std::vector<float> data(1001, 1.0f);
  for (int k = 0; k < 6; ++k) {
    if (bad && k == badSeq) {
      if (mode == "skip") {
        kolo::trace::Scope span("busy elsewhere", "test");
        // Busy until kolo run stops it once the others fail; a signal (SIGUSR1 asking for
        // the flight recorder) must not end the wait early.
        for (unsigned left = 120; left > 0;) left = ::sleep(left);
        return 0;
      }
      if (mode == "stop") ::raise(SIGSTOP);
    }
    const size_t count = bad && k == badSeq && mode == "mismatch" ? 1001 : 1000;
    comm->allreduce(data.data(), data.data(), count, kolo::DType::F32, kolo::comm::ReduceOp::Sum);
  }
  if (mode == "mixed") {
    const int rank = comm->rank(), size = comm->size();
    comm->broadcast(data.data(), 10, kolo::DType::F32, 0);
    comm->iallreduce(data.data(), data.data(), 100, kolo::DType::F32, kolo::comm::ReduceOp::Sum)->wait();
    if (size > 1) {
      const int right = (rank + 1) % size, left = (rank + size - 1) % size;
      std::vector<float> in(25);
      auto receive = comm->irecv(in.data(), 25, kolo::DType::F32, left, 5);
      auto send = comm->isend(data.data(), 25, kolo::DType::F32, right, 5);
      send->wait();
      receive->wait();
      if (rank % 2 == 0) {
        comm->send(data.data(), 7, kolo::DType::F32, right, 6);
        comm->recv(in.data(), 7, kolo::DType::F32, left, 6);
      } else {
        comm->recv(in.data(), 7, kolo::DType::F32, left, 6);
        comm->send(data.data(), 7, kolo::DType::F32, right, 6);
      }
    }
    comm->barrier();
    kolo::flight::dump("end");
  }
  std::printf("rank %d done\n", comm->rank());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "hang_program: %s\n", e.what());
  return 1;
}
