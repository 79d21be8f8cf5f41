#include "train/train_data.h"

#include "train/run_settings.h"

namespace wiola {

void TrainData::open(const RunSettings& run, uint64_t data_seed) {
  const RunConfig& rc = run.rc;
  loader = std::make_unique<TokenLoader>(rc.data_sources(), "train", run.T, int(run.GB), run.me.dp, rc.parallel.dp,
                                         data_seed, rc.data.shuffle, rc.data.prefetch > 0,
                                         size_t(rc.data.max_open_shards), rc.data.stages);
  loader->expect(uint32_t(rc.model.V));
}

}  // namespace wiola
