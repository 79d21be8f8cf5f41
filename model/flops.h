// The one FLOP count behind every throughput and MFU figure of the project
// (wiola bench step, the GPU benchmark, reports): matmuls with every weight
// (the tied head included), causal self-attention QK^T and PV over the
// average (T+1)/2 visible keys, and the context attention; forward x 3 for
// forward + backward. Not counted: elementwise work, ATM's savings (keys it
// merges away), recompute.
#pragma once

#include "model/config.h"

namespace wiola {

// FLOPs of one training step (forward + backward) on B sequences of c.T.
double train_step_flops(const ModelConfig& c, int B);
// The causal self-attention part of it (QK^T and PV, every layer, x 3).
double attention_step_flops(const ModelConfig& c, int B);
// Its parts: layer l (weights, context attention, its share of the causal
// attention) and the tied head; train_step_flops is their sum.
double layer_step_flops(const ModelConfig& c, int B, int l);
double head_step_flops(const ModelConfig& c, int B);
// One pass of the weight GEMMs (2 FLOPs per weight and token): what the
// weight-gradient half of a split backward computes (the W of a zero-bubble
// schedule, dist/schedule.h); the rest of the backward (input gradients,
// attention, the context attention) is the B. Layer l, and the tied head.
double layer_weight_grad_flops(const ModelConfig& c, int B, int l);
double head_weight_grad_flops(const ModelConfig& c, int B);

}  // namespace wiola
