#include "tp/models/attention_dp.h"

#include <c10/util/Exception.h>

#include <vector>

namespace tp {

AttentionDataParallel AttentionDataParallel::none(const Communicator& world) {
  AttentionDataParallel dp;
  dp.world = world;
  dp.attention = world;
  return dp;
}

AttentionDataParallel AttentionDataParallel::make(const Communicator& world, int64_t size) {
  const int64_t w = world.world_size();
  TORCH_CHECK_VALUE(size >= 1 && w % size == 0, "attention data parallelism: attention_data_parallel_size=", size,
                    " must divide the world size ", w, " (each of its groups is world / size ranks)");
  if (size == 1) return none(world);
  const int64_t per = w / size, rank = world.rank();
  AttentionDataParallel dp;
  dp.size = size;
  dp.group = rank / per;
  dp.world = world;
  std::vector<int64_t> group, replicas;
  for (int64_t r = dp.group * per; r < (dp.group + 1) * per; ++r) group.push_back(r);
  for (int64_t g = 0; g < size; ++g) replicas.push_back(g * per + rank % per);
  dp.attention = world.split(group);
  dp.replicas = world.split(replicas);
  return dp;
}

}  // namespace tp
