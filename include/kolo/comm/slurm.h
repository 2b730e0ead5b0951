// Slurm's side of starting a job: its compressed host lists (`node[01-04,07]`) expanded, and
// the address of the rendezvous store of a job step (the step's first host, a port derived
// from the job and step ids), so that `srun kolo ...` starts with nothing set by hand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kolo::comm {

/// Expands a host list in Slurm's compressed syntax, as SLURM_JOB_NODELIST holds it:
/// comma-separated names, each with any number of bracketed groups of numbers and ranges
/// (`a1,b[2-3]`, `node[01-04,07]`, `rack[1-2]n[1-2]`); a range keeps the zero padding of its
/// first number (`n[08-10]` gives n08, n09, n10). Hosts come in Slurm's order, the first one
/// first. Throws InvalidArgument naming `variable` and `list` for an empty list or name,
/// unbalanced or nested brackets, a group that is not numbers and ranges, a range that runs
/// backwards, or more than a million hosts.
std::vector<std::string> expandSlurmHostList(const std::string& variable, const std::string& list);

/// The port of the store that rank 0 of Slurm job `jobId`, step `stepId` hosts when nothing
/// names one: 15000 + (jobId * 100 + stepId % 100) % 17000, in 15000..31999 (below Linux's
/// ephemeral ports), different for each of a job's first 100 steps and for jobs whose ids
/// are close. Every task of the step computes the same port.
int slurmStorePort(int64_t jobId, int64_t stepId);

}  // namespace kolo::comm
