// Umbrella header of the nn module: Module, layers, attention, LLaMA-style blocks, built-in
// models.
#pragma once

#include "kolo/nn/attention.h"
#include "kolo/nn/batch_norm.h"
#include "kolo/nn/language_model.h"
#include "kolo/nn/layers.h"
#include "kolo/nn/llama.h"
#include "kolo/nn/models.h"
#include "kolo/nn/module.h"
#include "kolo/ops.h"
