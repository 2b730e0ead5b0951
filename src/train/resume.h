// What every trainer does alike to resume: train::load under the name of the caller's option
// (fit's resumeDir, the parameter servers'), so that a missing directory, one without a good
// checkpoint and one written by a run of another identity are told in the caller's words;
// and the identity a trainer fills in from what it knows.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kolo/train/run_options.h"
#include "kolo/train/state.h"

namespace kolo::train::detail {

/// train::load, whose errors name the directory as `option` ("FitOptions::resumeDir").
Position loadFrom(const std::vector<Stateful*>& objects, const CheckpointOptions& options,
                  const char* option);

/// options.identity with what the trainer knows added where the caller left it out: "batch"
/// (the global batch) and "seed". A model of other shapes is refused by the weights' own
/// check (Mismatch naming the tensor), whatever the identity holds.
std::map<std::string, std::string> identityOf(const RunOptions& options);

}  // namespace kolo::train::detail
