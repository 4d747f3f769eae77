#pragma once
// tp: Megatron-style tensor-parallel linear layers on LibTorch. The umbrella header.
#include "tp/comm/all_reduce_strategy.h"
#include "tp/comm/communicator.h"
#include "tp/comm/launch.h"
#include "tp/layers/column_parallel_linear.h"
#include "tp/layers/gate_up_parallel_linear.h"
#include "tp/layers/qkv_parallel_linear.h"
#include "tp/layers/row_parallel_linear.h"
#include "tp/loader/load_shard.h"
#include "tp/loader/tensor_source.h"
#include "tp/quant/quant_config.h"
#include "tp/quant/quant_method.h"
#include "tp/shard/shard.h"
