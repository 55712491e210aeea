// The AutoSP pipeline: the passes in their contractual order.
#include "graph/passes/autosp/autosp.h"

namespace autosp {

const std::vector<Pass>& autosp_pipeline() {
  static const std::vector<Pass> pipeline = {
      {"rewrite_composite_attention", passes::rewrite_composite_attention, true},
      {"prepare_autosp_inputs", passes::prepare_autosp_inputs, true},
      {"shard_seq_dim", passes::shard_seq_dim, false},
      {"shard_input_ids", passes::shard_input_ids, false},
      {"shard_label_ids", passes::shard_label_ids, false},
      {"shard_position_ids", passes::shard_position_ids, false},
      {"shard_doc_start", passes::shard_doc_start, false},
      {"shard_token_index", passes::shard_token_index, false},
      {"normalize_loss", passes::normalize_loss, false},
      {"insert_attention_all_to_all", passes::insert_attention_all_to_all, false},
      {"propagate_shapes", passes::propagate_shapes, true},
      {"insert_ring_attention", passes::insert_ring_attention, true},
      {"canonicalize", passes::canonicalize, true},
  };
  return pipeline;
}

}  // namespace autosp
