// The run device and the copies between it and the host.
#include "train/run_device.h"

#include "device/cuda/device.h"
#include "graph/ops.h"  // kIgnoreIndex
#include "tensor/check.h"

namespace autosp {

Device pick_device(const Config& cfg) {
  switch (cfg.runtime.device) {
    case DeviceKind::cpu: return Device{};
    case DeviceKind::cuda: {
      const Device dev{DeviceKind::cuda, select_device_for_local_rank()};
      check_attention_backend(cfg.runtime.attention);
      return dev;
    }
  }
  return Device{};
}

void to_run_device(ParamMap& m, Device dev) {
  for (auto& [name, t] : m)
    if (t.device() != dev) t = to_device(t, dev);
}

Tensor host_copy(const Tensor& t) { return t.device().kind == DeviceKind::cpu ? t : to_device(t, Device{}); }

ParamMap host_copy(const ParamMap& m) {
  ParamMap out;
  for (const auto& [name, t] : m) out[name] = host_copy(t);
  return out;
}

AdamW host_copy(const AdamW& opt) {
  AdamW out;
  out.exp_avg = host_copy(opt.exp_avg);
  out.exp_avg_sq = host_copy(opt.exp_avg_sq);
  out.step = opt.step;
  return out;
}

namespace {

void check_batch(const Batch& b, int64_t vocab) {
  const int64_t n = b.input_ids.numel();
  const int64_t* ids = b.input_ids.data<int64_t>();
  const int64_t* labels = b.labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab)
      throw UsageError(str("token id ", ids[i], " at position ", i, " of the batch is outside [0, ", vocab,
                           ") (model.vocab_size)"));
    if (labels[i] != kIgnoreIndex && (labels[i] < 0 || labels[i] >= vocab))
      throw UsageError(str("label ", labels[i], " at position ", i, " of the batch is outside [0, ", vocab,
                           ") (model.vocab_size)"));
  }
}

}  // namespace

ParamMap run_feeds(const Batch& batch, const ParamMap& params, int64_t vocab, Device dev) {
  if (dev.kind == DeviceKind::cuda) check_batch(batch, vocab);
  if (batch.doc_start.defined()) check_doc_start(batch.doc_start);
  ParamMap feeds = batch_feeds(batch);
  to_run_device(feeds, dev);
  for (const auto& [name, p] : params) feeds[name] = p;
  return feeds;
}

}  // namespace autosp
