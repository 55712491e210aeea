// FLOPs, communication volumes and the alpha-beta scaling projection (docs/scaling.md).
#include "tools/scaling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <spdlog/fmt/fmt.h>

#include "config/config.h"
#include "models/flops.h"
#include "tensor/check.h"
#include "tensor/input_file.h"

namespace autosp {
namespace {

using json = nlohmann::json;

}  // namespace

CommVolume step_comm_volume(const ModelConfig& m, int64_t batch, int64_t seq, int64_t sp, int64_t world,
                            int64_t act_bytes, int64_t grad_bytes) {
  const ModelDims d = model_dims(m);
  if (sp < 1 || world < 1 || world % sp != 0) throw UsageError(str("sp ", sp, " does not divide the world ", world));
  if (d.N % sp != 0) throw UsageError(str(d.N, " attention heads are not divisible by sp ", sp));
  CommVolume v;
  v.kv_heads = d.Nkv;
  if (d.Nkv % sp != 0) {
    if (d.Nkv > sp || sp % d.Nkv != 0) throw UsageError(str(d.Nkv, " K/V heads can neither be split nor replicated over sp ", sp));
    v.kv_heads = sp;  // replicated up to sp before the all-to-all
  }
  if (sp > 1) {
    const int64_t S = (seq + sp - 1) / sp * sp;  // padded like the trainer
    // One all-to-all of a local [B, h, S/sp, D] (or [B, h/sp, S, D]) tensor sends (sp-1) of its sp chunks.
    auto sent = [&](int64_t heads) { return batch * heads * (S / sp) * d.D * act_bytes / sp * (sp - 1); };
    const int64_t per_layer = 2 * (2 * sent(d.N) + 2 * sent(v.kv_heads));  // q, o, k, v; forward and backward
    v.all_to_all_calls = 8 * d.L;
    v.all_to_all_bytes = per_layer * d.L;
  }
  if (world > 1) {
    v.grad_bytes = param_count(m) * grad_bytes;
    v.all_reduce_bytes = v.grad_bytes + 2 * act_bytes;  // + loss sum and valid-token count (normalize_loss)
  }
  return v;
}

// ---- projection ------------------------------------------------------------------------------

namespace {

ModelConfig llama3_8b() {
  ModelConfig m;
  m.arch = Arch::llama;
  m.num_hidden_layers = 32;
  m.hidden_size = 4096;
  m.num_attention_heads = 32;
  m.num_key_value_heads = 8;
  m.intermediate_size = 14336;
  m.vocab_size = 128256;
  m.max_position_embeddings = 1 << 24;
  m.rope_theta = 500000.0;
  m.tie_word_embeddings = false;
  return m;
}

// Strict readers for the projection config: the key path is in every message.
double number(const json& j, const std::string& key, double lo, double hi) {
  if (!j.is_number()) throw UsageError(str(key, ": expected a number, got ", j.dump()));
  const double v = j.get<double>();
  if (!(v >= lo && v <= hi)) throw UsageError(str(key, ": ", j.dump(), " is outside [", lo, ", ", hi, "]"));
  return v;
}

int64_t integer(const json& j, const std::string& key, int64_t lo, int64_t hi) {
  if (!j.is_number_integer()) throw UsageError(str(key, ": expected an integer, got ", j.dump()));
  const int64_t v = j.get<int64_t>();
  if (v < lo || v > hi) throw UsageError(str(key, ": ", v, " is outside [", lo, ", ", hi, "]"));
  return v;
}

bool boolean(const json& j, const std::string& key) {
  if (!j.is_boolean()) throw UsageError(str(key, ": expected true or false, got ", j.dump()));
  return j.get<bool>();
}

std::vector<int64_t> int_list(const json& j, const std::string& key, int64_t lo, int64_t hi) {
  if (!j.is_array() || j.empty()) throw UsageError(str(key, ": expected a non-empty array of integers"));
  std::vector<int64_t> out;
  for (size_t i = 0; i < j.size(); ++i) out.push_back(integer(j[i], str(key, "[", i, "]"), lo, hi));
  return out;
}

LinkModel link(const json& j, const std::string& key, LinkModel l) {
  if (!j.is_object()) throw UsageError(str(key, ": expected an object {alpha_us, bandwidth_GBps}"));
  for (const auto& [k, v] : j.items()) {
    if (k == "alpha_us") l.alpha_s = number(v, key + ".alpha_us", 0, 1e6) * 1e-6;
    else if (k == "bandwidth_GBps") l.bytes_per_s = number(v, key + ".bandwidth_GBps", 1e-6, 1e6) * 1e9;
    else throw UsageError(str(key, ".", k, ": unknown key (expected alpha_us, bandwidth_GBps)"));
  }
  return l;
}

int64_t round_down(int64_t v, int64_t step) { return v / step * step; }

// Time of one collective step moving `on_node` bytes over NVLink and `off_node` over InfiniBand
// concurrently (each link pays its latency once when it carries anything).
double link_time(const ProjectionConfig& c, double on_node, double off_node) {
  double t = 0;
  if (on_node > 0) t = std::max(t, c.nvlink.alpha_s + on_node / c.nvlink.bytes_per_s);
  if (off_node > 0) t = std::max(t, c.infiniband.alpha_s + off_node / c.infiniband.bytes_per_s);
  return t;
}

}  // namespace

ProjectionConfig parse_projection_config(const json& j, const std::string& origin) {
  ProjectionConfig c;
  c.model = llama3_8b();
  c.source = origin;
  if (!j.is_object()) throw UsageError(str(origin, ": expected a JSON object"));
  for (const auto& [k, v] : j.items()) {
    if (k == "model") {
      if (!v.is_object()) throw UsageError(str(origin, ": model: expected an object"));
      json model = v;
      if (!model.contains("max_position_embeddings")) model["max_position_embeddings"] = 1 << 24;
      c.model = parse_config({{"model", model}}, {}, origin).model;
    } else if (k == "gpus") {
      c.gpus = int_list(v, k, 1, 1 << 20);
    } else if (k == "seq_lens") {
      c.seq_lens = int_list(v, k, 1, int64_t{1} << 40);
    } else if (k == "batch") {
      c.batch = integer(v, k, 1, 1 << 20);
    } else if (k == "activation_bytes") {
      c.activation_bytes = integer(v, k, 1, 8);
    } else if (k == "grad_bytes") {
      c.grad_bytes = integer(v, k, 1, 8);
    } else if (k == "gpus_per_node") {
      c.gpus_per_node = integer(v, k, 1, 1 << 20);
    } else if (k == "gpu_memory_bytes") {
      c.gpu_memory_bytes = number(v, k, 1, 1e16);
    } else if (k == "memory_reserve_fraction") {
      c.memory_reserve_fraction = number(v, k, 0, 0.99);
    } else if (k == "replicated_bytes_per_param") {
      c.replicated_bytes_per_param = number(v, k, 0, 64);
    } else if (k == "sharded_bytes_per_param") {
      c.sharded_bytes_per_param = number(v, k, 0, 64);
    } else if (k == "zero_stage") {
      c.zero_stage = integer(v, k, 0, 3);
    } else if (k == "activation_checkpointing") {
      c.activation_checkpointing = boolean(v, k);
    } else if (k == "overlap_grad_allreduce") {
      c.overlap_grad_allreduce = boolean(v, k);
    } else if (k == "achieved_tflops") {
      c.achieved_tflops = number(v, k, 1e-9, 1e9);
    } else if (k == "peak_tflops") {
      c.peak_tflops = number(v, k, 1e-9, 1e9);
    } else if (k == "links") {
      if (!v.is_object()) throw UsageError("links: expected an object {nvlink, infiniband}");
      for (const auto& [lk, lv] : v.items()) {
        if (lk == "nvlink") c.nvlink = link(lv, "links.nvlink", c.nvlink);
        else if (lk == "infiniband") c.infiniband = link(lv, "links.infiniband", c.infiniband);
        else throw UsageError(str("links.", lk, ": unknown key (expected nvlink, infiniband)"));
      }
    } else if (k == "comment") {
      // free text
    } else {
      throw UsageError(str(origin, ": ", k, ": unknown key (see docs/scaling.md)"));
    }
  }
  for (int64_t g : c.gpus) projection_sp(c.model, g);  // every GPU count must admit some SP degree
  if (c.zero_stage >= 0) {
    if (j.contains("replicated_bytes_per_param") || j.contains("sharded_bytes_per_param"))
      throw UsageError(str(origin, ": zero_stage sets replicated_bytes_per_param and sharded_bytes_per_param; "
                               "give one or the other"));
    const ZeroStateBytes z = zero_state_bytes(c.zero_stage);
    c.replicated_bytes_per_param = z.replicated;
    c.sharded_bytes_per_param = z.sharded;
  }
  return c;
}

ZeroStateBytes zero_state_bytes(int64_t stage) {
  switch (stage) {
    case 0: return {4 + 8 + 8, 0};  // parameters, gradients (output + bucket), moments
    case 1: return {4 + 8, 8};      // the moments sharded
    case 2: return {4, 4 + 8};      // and the gradients: only the reduce-scattered shard outlives the backward
    case 3: return {0, 4 + 4 + 8};  // and the parameters (plus two gathered layers: state_bytes_per_gpu)
    default: break;
  }
  throw UsageError(str("zero_stage ", stage, ": expected 0, 1, 2 or 3"));
}

ProjectionConfig load_projection_config(const std::string& path) {
  try {
    return parse_projection_config(parse_json(read_input_file(path, "a projection config (JSON)"), path), path);
  } catch (const UsageError& e) {
    throw UsageError(str("--project-config ", e.what()));
  }
}

int64_t projection_sp(const ModelConfig& m, int64_t gpus) {
  const ModelDims d = model_dims(m);
  for (int64_t sp = gpus; sp >= 1; --sp) {
    if (gpus % sp || d.N % sp) continue;
    if (d.Nkv % sp == 0 || (d.Nkv < sp && sp % d.Nkv == 0)) return sp;
  }
  return 1;
}

double activation_bytes_per_token(const ProjectionConfig& c) {
  const ModelDims d = model_dims(c.model);
  // Saved by one layer per token: norm inputs/outputs, q, k, v, attention output, gate, up, SwiGLU.
  const double layer = 7.0 * d.C + 2.0 * d.Nkv * d.D + 4.0 * d.M;
  // Checkpointing keeps each layer's input and one layer's activations and their gradients live;
  // without it every layer's activations stay, plus the gradients of the layer being processed.
  const double elems = c.activation_checkpointing ? d.L * d.C + 2 * layer : (d.L + 1) * layer;
  const double logits = 2.0 * d.V * 4;  // fp32 logits and their gradient
  return elems * static_cast<double>(c.activation_bytes) + logits;
}

double state_bytes_per_gpu(const ProjectionConfig& c, int64_t gpus) {
  const double p = static_cast<double>(param_count(c.model));
  double bytes = p * c.replicated_bytes_per_param + p * c.sharded_bytes_per_param / static_cast<double>(gpus);
  if (c.zero_stage == 3) {  // the layer in use and the next one's prefetch, gathered whole (f32)
    const ModelConfig& m = c.model;
    const double layer = (p - static_cast<double>(m.vocab_size * m.hidden_size) *
                                  (m.tie_word_embeddings ? 1.0 : 2.0)) / static_cast<double>(m.num_hidden_layers);
    bytes += 2 * layer * 4;
  }
  return bytes;
}

ProjectionRow project_point(const ProjectionConfig& c, int64_t gpus, int64_t seq) {
  ProjectionRow r;
  r.gpus = gpus;
  r.sp = projection_sp(c.model, gpus);
  r.dp = gpus / r.sp;
  r.seq = (seq + r.sp - 1) / r.sp * r.sp;
  const double flops_per_gpu = step_flops(c.model, c.batch, r.seq) / static_cast<double>(r.sp);
  r.compute_s = flops_per_gpu / (c.achieved_tflops * 1e12);

  // All-to-all: each call's bytes split into NVLink (peers on this node) and InfiniBand (the rest);
  // SP groups are consecutive ranks, so a group of sp ≤ gpus_per_node stays on one node.
  const CommVolume v = step_comm_volume(c.model, c.batch, r.seq, r.sp, gpus, c.activation_bytes, c.grad_bytes);
  if (r.sp > 1) {
    const ModelDims d = model_dims(c.model);
    const double g = static_cast<double>(std::min(c.gpus_per_node, r.sp)), sp = static_cast<double>(r.sp);
    for (int64_t heads : {d.N, v.kv_heads}) {
      const double local = static_cast<double>(c.batch * heads * (r.seq / r.sp) * d.D * c.activation_bytes);
      const double one = link_time(c, local * (g - 1) / sp, local * (sp - g) / sp);
      r.all_to_all_s += 4.0 * static_cast<double>(d.L) * one;  // 2 tensors of this kind × forward/backward
    }
  }
  // Gradient all-reduce: a ring over all GPUs, 2(P-1) steps each moving 1/P of the buffer;
  // InfiniBand is the bottleneck once the ring leaves a node.
  if (gpus > 1) {
    const double P = static_cast<double>(gpus), wire = 2.0 * (P - 1) / P * static_cast<double>(v.grad_bytes);
    const LinkModel& l = gpus <= c.gpus_per_node ? c.nvlink : c.infiniband;
    r.all_reduce_s = 2.0 * (P - 1) * l.alpha_s + wire / l.bytes_per_s;
  }
  r.exposed_all_reduce_s =
      c.overlap_grad_allreduce ? std::max(0.0, r.all_reduce_s - 2.0 / 3.0 * r.compute_s) : r.all_reduce_s;
  r.step_s = r.compute_s + r.all_to_all_s + r.exposed_all_reduce_s;
  r.efficiency = r.compute_s / r.step_s;
  r.mfu = flops_per_gpu / r.step_s / (c.peak_tflops * 1e12);
  r.tokens_per_s_per_gpu = static_cast<double>(r.dp * c.batch * r.seq) / r.step_s / static_cast<double>(gpus);
  r.memory_bytes = state_bytes_per_gpu(c, gpus) +
                   static_cast<double>(c.batch * (r.seq / r.sp)) * activation_bytes_per_token(c);
  r.fits = r.memory_bytes <= c.gpu_memory_bytes * (1 - c.memory_reserve_fraction);
  return r;
}

UlyssesRing projection_ulysses_ring(const ProjectionConfig& c, int64_t gpus) {
  const ModelDims d = model_dims(c.model);
  for (int64_t u = std::min(gpus, c.gpus_per_node); u > 1; --u)
    if (gpus % u == 0 && d.N % u == 0 && (d.Nkv % u == 0 || u % d.Nkv == 0)) return {u, gpus / u};
  return {1, gpus};
}

ProjectionRow project_ring_point(const ProjectionConfig& c, int64_t gpus, int64_t seq) {
  const UlyssesRing l = projection_ulysses_ring(c, gpus);
  const ModelDims d = model_dims(c.model);
  ProjectionRow r;
  r.gpus = gpus;
  r.sp = gpus;
  r.dp = 1;
  r.ulysses = l.ulysses;
  r.ring = l.ring;
  const int64_t multiple = l.ring > 1 ? 2 * gpus : gpus;
  r.seq = (seq + multiple - 1) / multiple * multiple;
  const double flops_per_gpu = step_flops(c.model, c.batch, r.seq) / static_cast<double>(gpus);
  r.compute_s = flops_per_gpu / (c.achieved_tflops * 1e12);
  const double U = static_cast<double>(l.ulysses), R = static_cast<double>(l.ring);
  const double local_tokens = static_cast<double>(c.batch * (r.seq / gpus));
  const int64_t kv_local = d.Nkv >= l.ulysses ? d.Nkv / l.ulysses : 1;
  if (l.ulysses > 1)  // q, k, v, o and their gradients inside a node
    for (double heads : {static_cast<double>(d.N), static_cast<double>(std::max(d.Nkv, l.ulysses))}) {
      const double local = local_tokens * heads * static_cast<double>(d.D * c.activation_bytes);
      r.all_to_all_s += 4.0 * static_cast<double>(d.L) * link_time(c, local * (U - 1) / U, 0);
    }
  if (l.ring > 1) {
    const double block = 2.0 * static_cast<double>(c.batch * kv_local * (r.seq / l.ring) * d.D * c.activation_bytes);
    const LinkModel& link = l.ulysses * l.ring <= c.gpus_per_node ? c.nvlink : c.infiniband;
    const double transfers = static_cast<double>(d.L) * (3.0 * R - 2.0) * (link.alpha_s + block / link.bytes_per_s);
    // What they overlap: the attention of the ring steps (causal: half of S² per layer; the
    // backward about 2.5× the forward), this GPU's share.
    const double attention_flops = 3.5 * 4.0 * static_cast<double>(c.batch * d.N * d.D * d.L) *
                                   static_cast<double>(r.seq) * static_cast<double>(r.seq) / 2.0 /
                                   static_cast<double>(gpus);
    r.ring_s = std::max(0.0, transfers - attention_flops / (c.achieved_tflops * 1e12));
  }
  r.step_s = r.compute_s + r.all_to_all_s + r.ring_s;
  r.efficiency = r.compute_s / r.step_s;
  r.mfu = flops_per_gpu / r.step_s / (c.peak_tflops * 1e12);
  r.tokens_per_s_per_gpu = static_cast<double>(c.batch * r.seq) / r.step_s / static_cast<double>(gpus);
  r.memory_bytes = state_bytes_per_gpu(c, gpus) + local_tokens * activation_bytes_per_token(c);
  r.fits = r.memory_bytes <= c.gpu_memory_bytes * (1 - c.memory_reserve_fraction);
  return r;
}

int64_t longest_ring_sequence(const ProjectionConfig& c, int64_t gpus) {
  const double free_bytes = c.gpu_memory_bytes * (1 - c.memory_reserve_fraction) - state_bytes_per_gpu(c, gpus);
  if (free_bytes <= 0) return 0;
  const double local = std::floor(free_bytes / activation_bytes_per_token(c) / static_cast<double>(c.batch));
  return round_down(static_cast<int64_t>(local) * gpus, std::lcm(int64_t{1024}, 2 * gpus));
}

int64_t longest_sequence(const ProjectionConfig& c, int64_t gpus) {
  const int64_t sp = projection_sp(c.model, gpus);
  const double free_bytes = c.gpu_memory_bytes * (1 - c.memory_reserve_fraction) - state_bytes_per_gpu(c, gpus);
  if (free_bytes <= 0) return 0;
  const double local = std::floor(free_bytes / activation_bytes_per_token(c) / static_cast<double>(c.batch));
  const int64_t step = std::lcm(int64_t{1024}, sp);
  return round_down(static_cast<int64_t>(local) * sp, step);
}

std::string projection_report(const ProjectionConfig& c) {
  const ModelConfig& m = c.model;
  std::string out;
  out += fmt::format("# Scaling projection ({})\n\n", c.source);
  out += fmt::format("model: {} layers, hidden {}, {} heads, {} KV heads, MLP {}, vocab {}: {:.3f} B parameters; "
                     "batch {} sequence(s) per SP group\n",
                     m.num_hidden_layers, m.hidden_size, m.num_attention_heads, m.num_key_value_heads,
                     m.mlp_width(), m.vocab_size, static_cast<double>(param_count(m)) / 1e9, c.batch);
  out += fmt::format("compute: {:.4g} TFLOP/s achieved per GPU (peak {:.4g}); activations {} B, gradients {} B per "
                     "element; {} GPUs per node\n",
                     c.achieved_tflops, c.peak_tflops, c.activation_bytes, c.grad_bytes, c.gpus_per_node);
  out += fmt::format("links: NVLink alpha {:.3g} us, {:.4g} GB/s; InfiniBand alpha {:.3g} us, {:.4g} GB/s\n",
                     c.nvlink.alpha_s * 1e6, c.nvlink.bytes_per_s / 1e9, c.infiniband.alpha_s * 1e6,
                     c.infiniband.bytes_per_s / 1e9);
  out += fmt::format("memory: {:.4g} GB per GPU ({:.0f}% reserved); states {} B/param replicated + {} B/param "
                     "sharded{}; activations {:.1f} KB per local token (checkpointing {}); gradient all-reduce {}\n\n",
                     c.gpu_memory_bytes / 1e9, c.memory_reserve_fraction * 100, c.replicated_bytes_per_param,
                     c.sharded_bytes_per_param,
                     c.zero_stage < 0 ? std::string()
                                      : fmt::format(" (ZeRO stage {}{})", c.zero_stage,
                                                    c.zero_stage == 3 ? ", + two gathered layers" : ""),
                     activation_bytes_per_token(c) / 1e3,
                     c.activation_checkpointing ? "on" : "off", c.overlap_grad_allreduce ? "overlapped with backward" : "not overlapped");
  out += "| GPUs | sp × dp | seq | compute ms | all-to-all ms | all-reduce ms (exposed) | step ms | efficiency | MFU | "
         "tokens/s/GPU | GB/GPU | fits |\n";
  out += "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto row = [&](const ProjectionRow& r) {
    return fmt::format("| {} | {} × {} | {} | {:.1f} | {:.1f} | {:.1f} ({:.1f}) | {:.1f} | {:.1f}% | {:.1f}% | {:.0f} | "
                       "{:.1f} | {} |\n",
                       r.gpus, r.sp, r.dp, r.seq, r.compute_s * 1e3, r.all_to_all_s * 1e3, r.all_reduce_s * 1e3,
                       r.exposed_all_reduce_s * 1e3, r.step_s * 1e3, r.efficiency * 100, r.mfu * 100,
                       r.tokens_per_s_per_gpu, r.memory_bytes / 1e9, r.fits ? "yes" : "no");
  };
  for (int64_t g : c.gpus)
    for (int64_t s : c.seq_lens) out += row(project_point(c, g, s));
  out += "\nLongest trainable sequence (a multiple of 1024 that fits per-GPU memory):\n\n";
  out += "| GPUs | sp × dp | longest seq | compute ms | all-to-all ms | all-reduce ms (exposed) | step ms | efficiency | "
         "MFU | tokens/s/GPU | GB/GPU | fits |\n";
  out += "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (int64_t g : c.gpus) {
    const int64_t s = longest_sequence(c, g);
    if (s == 0) {
      out += fmt::format("| {} | {} × {} | none: model states alone exceed the memory | | | | | | | | | no |\n", g,
                         projection_sp(m, g), g / projection_sp(m, g));
      continue;
    }
    out += row(project_point(c, g, s));
  }
  out += "\nUlysses × ring (sequence_parallel.ring_size; U inside a node on NVLink, the ring across nodes): the "
         "layout a planner picks, the longest trainable sequence on it, and the step at that length\n\n";
  out += "| GPUs | U × R | seq | compute ms | all-to-all ms | ring ms (exposed) | step ms | efficiency | MFU | "
         "tokens/s/GPU | GB/GPU | fits |\n";
  out += "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto ring_row = [&](int64_t g, int64_t s, bool longest) {
    const ProjectionRow r = project_ring_point(c, g, s == 0 ? 1024 : s);
    out += fmt::format("| {} | {} × {} | {}{} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f}% | {:.1f}% | {:.0f} | {:.1f} | {} |\n",
                       r.gpus, r.ulysses, r.ring, longest ? "longest: " : "",
                       s == 0 ? std::string("none") : std::to_string(r.seq), r.compute_s * 1e3, r.all_to_all_s * 1e3,
                       r.ring_s * 1e3, r.step_s * 1e3, r.efficiency * 100, r.mfu * 100, r.tokens_per_s_per_gpu,
                       r.memory_bytes / 1e9, r.fits ? "yes" : "no");
  };
  for (int64_t g : c.gpus) {
    for (int64_t s : c.seq_lens) ring_row(g, s, false);
    ring_row(g, longest_ring_sequence(c, g), true);
  }
  return out;
}

}  // namespace autosp
