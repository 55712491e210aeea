// Data sources for training: each yields the sequences of the run's global read order as batches
// of input_ids, labels and position_ids [count, seq_len] (int64). Labels are shifted here, before
// any sequence sharding: label[t] = token[t+1] of the full sequence, so no target is lost at a
// shard boundary. Sequence g of the run (g = (k·dp + d)·batch + b for sequence b of step k on dp
// rank d without accumulation; the trainer computes g itself with it) is a pure function of g,
// the config and the files, so a run resumed at any g reads exactly what the first run would have
// (train/data_order.h: the order, epochs, shuffle, mix and the position a checkpoint records).
//
//   tokens     llm.c shards (256 × int32 header; magic 20240520 version 1 with uint16 tokens, or
//              magic 20240801 version 7 with uint32 tokens). `path` is one file or a glob; matching
//              shards are concatenated in sorted order into one token stream of n tokens, which
//              holds N = ⌊(n − 1) / seq_len⌋ windows: window w is the seq_len + 1 tokens from
//              w·seq_len. Sequence g of epoch e = g / N reads window g mod N, or with data.shuffle
//              window π_e(g mod N) of a permutation new each epoch. The < seq_len tokens after the
//              last window are not read.
//   text       the UTF-8 bytes of the file at `path` as tokens (vocab ≥ 256), same read order.
//   mix        data.mix: several token streams (or text files) with weights; sequence g goes to
//              dataset k by a fixed schedule of the weights and is that dataset's sequence j (its
//              own epochs and shuffle). Each path is validated like data.path.
//   synthetic  the embedded default: a generated associative-recall task. Each sequence lists
//              key→value pairs (one token per pair) in its first half and queries them as "key
//              value", in another order, in its second half; only the answers (the value after a
//              queried key) are labelled, everything else
//              is -100. Answering needs attention across the whole sequence, so a falling loss shows
//              that attention spans it; `accuracy` reports the task's accuracy. Endless: sequence g
//              is generated from (seed, g).
//
// Token shards and text are memory-mapped, never read whole: opening one reads its header, a batch
// reads its windows (and drops those pages from the rank's RSS again), so a rank's memory does
// not grow with the dataset. Each token read is checked against the vocabulary when it is read.
// Every malformed input (file, header, sizes, token ≥ vocab) is a UsageError naming the file. A
// file that shrinks or is replaced while the run reads it (truncate, cp over it, rename onto it) is
// a RuntimeFailure naming it, found before a batch reads it (a read past a shrunk mapping's end
// would be a SIGBUS).
//
// Loss masks (data.loss_mask_path beside data.path, data.val_loss_mask_path beside data.val_path,
// "loss_mask_path" in a data.mix entry): a file or glob of one-dimensional NumPy .npy files of
// uint8 or bool, one per token file in the same sorted order and of the same length (for text, one
// byte per byte of the file), memory-mapped like the shards. mask[i] = 0 removes token i of the
// stream as a target: the label that predicts it, label[t] of the window whose token t + 1 it is,
// is -100 (Hugging Face's labels[i] = -100 before the model's shift). Masks ride on the window:
// sequence g reads the mask of exactly the tokens it reads, in every read order (shuffle, mix).
// A mismatch in file count, length or dtype, a value other than 0 or 1, or a malformed header is a
// UsageError naming the mask and its token file. The loss is then the mean over the unmasked
// targets of the whole step (normalize_loss and train/accumulation count them globally).
//
// Preference pairs (data.pairs_path, with data.path of a "tokens" source; train.objective "dpo"): a
// file or glob of one-dimensional int32 (<i4) .npy files beside the shards, paired with them like
// loss masks and read with the window like them: Batch::pair_ids[t] is the pair id of window token
// t + 1. The pair ids delimit the documents (not EOS, which a chat template may put inside a
// prompt; decision 150): a sequence is a run of one id, each pad (0) a document of its own, and
// doc_start, position_ids and the ignored boundary targets are set as for packed documents, whether
// or not data.document_mask is set. A mismatch in count, length or dtype is a UsageError naming the file.
//
// Packed documents (data.document_mask with data.eos_token_id, tokens and text sources): a document
// ends with its EOS, which belongs to it; a sequence's first token starts one. Then position_ids
// restart at 0 at each document's first token, doc_start[t] is the position where token t's
// document begins (attention keeps query t to the keys [doc_start[t], t]), and the target of an
// EOS, the next document's first token, is ignored (-100). The read order does not change.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "tensor/tensor.h"
#include "train/data_order.h"

namespace autosp {

struct Batch {
  Tensor input_ids, labels, position_ids;  // i64 [batch, seq_len]
  Tensor doc_start = {};                   // i64 [batch, seq_len] with data.document_mask, else undefined
  Tensor token_index = {};                 // i64 [batch, seq_len] with lora_dropout (set_token_index), else undefined
  // i64 [batch, seq_len] with data.pairs_path, else undefined: the pair id of the token label[t]
  // predicts (shifted like the labels), k + 1 on pair k's chosen sequence, −(k + 1) on its
  // rejected one, 0 elsewhere.
  Tensor pair_ids = {};
};

// Sets b.token_index: token t of row i, sequence g = first + i of the read order, is g·seq_len + t,
// its index in the run's token stream. The dropout mask is a function of it (kernels/kinds.h), so
// every layout that reads sequence g drops the same elements of it.
void set_token_index(Batch& b, int64_t first);

// Marks the documents of `b` (input_ids and labels set) as above: sets doc_start, restarts
// position_ids, ignores the targets of `eos`.
void mark_documents(Batch& b, int64_t eos);

// The contract of doc_start (i64 [batch, seq_len]) the attention kernels rely on: in each row,
// 0 ≤ start[t] ≤ t and start never decreases along t (the CUDA backward stops at the first query
// tile past a key block's documents). A batch that breaks it is a UsageError naming the row and
// position; the runtime checks each batch before it runs (train/run_device.cpp).
void check_doc_start(const Tensor& doc_start);

// The batch padded at the end to a sequence length P divides: pad tokens 0 with ignored labels
// (-100) and position 0. Causal attention never lets a real token see the padding, and the
// ignored labels keep the loss and gradients exact. With packed documents the padding is one more
// document (it starts at S), so no padded query attends to a real key either.
Batch pad_to_multiple(const Batch& b, int64_t p);

// The graph's inputs (input_ids, labels, position_ids, and doc_start and token_index when set) by
// their names in the model's graph.
std::map<std::string, Tensor> batch_feeds(const Batch& b);

class DataSource {
 public:
  explicit DataSource(int64_t batch_size) : batch_(batch_size) {}
  virtual ~DataSource() = default;
  // The sequences g ∈ [first, first + count) of the run's read order, as rows 0..count-1. A pure
  // function of g (and the config and files): reading g from a fresh source equals reading it in
  // sequence, which is what makes a resume bit-identical at any step. first ≥ 0, count ≥ 1.
  virtual Batch read(int64_t first, int64_t count) const = 0;
  // Step `step`'s batch of dp rank d without accumulation (validation reads its batches so):
  // read((step·dp + d)·batch_size, batch_size). An index past 2^63 is a UsageError.
  Batch get(int64_t step, int64_t dp_rank, int64_t dp_size) const;
  // N: the sequences of one epoch, so that sequence g is read in epoch g / N. 0 when there is no
  // single epoch: synthetic data (endless) and a mix (each dataset has its own; epochs() has them).
  virtual int64_t sequences_per_epoch() const = 0;
  // Where the read stands after sequences [0, g): each dataset's epoch and the fraction of it read
  // (one entry; one per dataset for a mix; none for synthetic data). format_epochs() writes it.
  virtual std::vector<EpochProgress> epochs(int64_t g) const = 0;
  // What a checkpoint records to continue at sequence `next_sequence` (train/data_order.h);
  // global_batch is left 0 for the trainer to fill in.
  virtual DataPosition position(int64_t next_sequence) const = 0;
  virtual int64_t num_tokens() const = 0;  // size of the token stream, all datasets (0 for synthetic)
  virtual std::string describe() const = 0;  // one line for the log
  int64_t batch_size() const { return batch_; }

 private:
  int64_t batch_;
};

// The files a data `path` names: the file itself when it exists, else the sorted matches of a glob
// (no match is a UsageError naming the pattern).
std::vector<std::string> expand_path(const std::string& pattern);

// The training data. `seed` (train.seed) draws the synthetic data, and shuffles when data.seed
// is -1.
std::unique_ptr<DataSource> make_data_source(const DataConfig& cfg, int64_t vocab_size, uint64_t seed);

// The files and globs a run reads as data (data.path or each data.mix path, and data.val_path),
// for the checks that no output overwrites them.
std::vector<std::string> data_input_paths(const DataConfig& cfg);

// The validation data: data.val_path read like data.path by the same source, or for synthetic data
// sequences from a held-out stream (another seed than training's, so none is a training sequence
// but by chance). Batch k of it is get(k, dp_rank, dp). Never shuffled: every evaluation reads the
// same first sequences in file order, so its losses compare across evaluations and runs (the mix
// and data.shuffle are for training).
std::unique_ptr<DataSource> make_val_source(const DataConfig& cfg, int64_t vocab_size, uint64_t seed);

// One sequence and the model's argmax predictions at its labelled positions, for a log line:
// the context (tokens before the first labelled position), then each labelled position as
// "token→predicted" with "(want label)" where they differ. input, labels, predicted: [S].
std::string format_example(const std::vector<int64_t>& input, const std::vector<int64_t>& labels,
                           const std::vector<int64_t>& predicted);

// Fraction of labelled positions (label != -100) where argmax(logits) == label, as (correct, total).
// logits [rows, V] (f32, f64 or bf16), or the argmax itself as i64 [rows]; labels [rows].
std::pair<int64_t, int64_t> count_correct(const Tensor& logits, const Tensor& labels);

}  // namespace autosp
