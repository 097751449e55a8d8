// The split a task's data spec names: which partitioner, with which parameters. Clients cut
// their training data with it and the coordinator sizes the partitions with it (each
// partition's size bounds the sample count an update may claim), so both sides agree sample
// for sample. It sits with the wire format, which names the spec, above the partitioners of
// common/data, which know nothing of the wire.
#pragma once

#include <cstdint>
#include <vector>

#include "common/data/dataset.h"
#include "common/status.h"
#include "common/wire/messages.h"

namespace fedfleet::wire {

// The partitions of a data set with labels `labels` that `spec` describes (its scheme, seed and
// partition count; "block-cyclic" is common/data/block_cyclic.h's partitionBlockCyclic with
// spec.blocks and spec.skew, as the simulator splits; every other scheme is partitionIndices).
// spec.index and spec.subset are not read: the caller loads the subset. Errors as the
// partitioners'.
Result<std::vector<std::vector<uint32_t>>> splitBySpec(const std::vector<data::Label>& labels,
                                                       uint32_t num_classes,
                                                       const DataSpec& spec);

// The partitions of `ds`: by its labels as above, or, for a set of regression targets, by
// partitionUnlabelled (iid and quantity only; kInvalidArgument for a scheme that needs labels).
Result<std::vector<std::vector<uint32_t>>> splitBySpec(const data::Dataset& ds,
                                                       const DataSpec& spec);

}  // namespace fedfleet::wire
