// Data sources for training (see data.h): llm.c token shards, raw text bytes, a weighted mix of
// them and the synthetic associative-recall task, plus count_correct for the task's accuracy. The
// read order's arithmetic (windows, shuffle, mix schedule, positions) is train/data_order.cpp.
// Everything read from a file is validated before we allocate or index with it; a malformed file
// is a UsageError that starts with the file's path. Knows nothing of graphs, kernels or devices
// beyond CPU tensors.
#include "train/data.h"

#include <fcntl.h>
#include <glob.h>
#include <setjmp.h>
#include <signal.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "tensor/check.h"
#include "tensor/fd.h"

namespace autosp {
namespace {

constexpr int64_t kIgnore = -100;  // label of a position that is not scored
constexpr int64_t kMaskValues = 2;  // a loss mask holds 0 (not a target) or 1
constexpr int64_t kNoBound = int64_t{1} << 40;  // pair ids: any int32 value

// Check the shape parameters every source relies on (the config schema checks them too; a source
// built directly must not divide by zero or allocate a negative size).
void check_sizes(const DataConfig& cfg, int64_t vocab_size) {
  if (cfg.seq_len < 1) throw UsageError(str("data.seq_len: expected ≥ 1, got ", cfg.seq_len));
  if (cfg.batch_size < 1) throw UsageError(str("data.batch_size: expected ≥ 1, got ", cfg.batch_size));
  if (vocab_size < 1) throw UsageError(str("model.vocab_size: expected ≥ 1, got ", vocab_size));
}

// What every source reads with: whether it shuffles, and the key (train/data_order.h).
struct Order {
  bool shuffle = false;
  uint64_t seed = 0;
};

// The checks read() makes of its arguments (the trainer's arithmetic, not user input).
void check_read_args(int64_t first, int64_t count) {
  AUTOSP_ASSERT(first >= 0 && count >= 1 && first <= INT64_MAX - count, "data: read(", first, ", ", count, ")");
}

// rows × seq_len inputs and labels with position_ids 0..seq_len-1 in every row.
Batch make_batch(int64_t batch, int64_t seq_len, std::vector<int64_t> input, std::vector<int64_t> labels) {
  std::vector<int64_t> pos(static_cast<size_t>(batch * seq_len));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq_len; ++t) pos[static_cast<size_t>(b * seq_len + t)] = t;
  return {Tensor::from_vector<int64_t>({batch, seq_len}, input),
          Tensor::from_vector<int64_t>({batch, seq_len}, labels),
          Tensor::from_vector<int64_t>({batch, seq_len}, pos)};
}

// ---- packed documents ---------------------------------------------------------------------------

// A source whose batches get their documents marked (data.document_mask).
class DocumentSource final : public DataSource {
 public:
  DocumentSource(std::unique_ptr<DataSource> inner, int64_t eos)
      : DataSource(inner->batch_size()), inner_(std::move(inner)), eos_(eos) {}
  Batch read(int64_t first, int64_t count) const override {
    Batch b = inner_->read(first, count);
    mark_documents(b, eos_);
    return b;
  }
  int64_t sequences_per_epoch() const override { return inner_->sequences_per_epoch(); }
  std::vector<EpochProgress> epochs(int64_t g) const override { return inner_->epochs(g); }
  DataPosition position(int64_t next_sequence) const override { return inner_->position(next_sequence); }
  int64_t num_tokens() const override { return inner_->num_tokens(); }
  std::string describe() const override {
    return str(inner_->describe(), ", packed documents (EOS ", eos_, ", document mask)");
  }

 private:
  std::unique_ptr<DataSource> inner_;
  int64_t eos_;
};

// ---- token streams (tokens and text) ----------------------------------------------------------

// `path` opened for reading. O_NONBLOCK: opening a FIFO must not block (open_regular then rejects it).
int open_for_read(const std::string& path) { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK); }

// Open `path` as a regular file and return its size; a missing or unreadable file is a UsageError.
int64_t open_regular(const std::string& path, const Fd& file) {
  if (file.get() < 0) throw UsageError(str(path, ": cannot open (", std::strerror(errno), ")"));
  struct stat st;
  if (fstat(file.get(), &st) != 0) throw RuntimeFailure(str(path, ": cannot stat (", std::strerror(errno), ")"));
  if (!S_ISREG(st.st_mode)) throw UsageError(str(path, ": not a regular file"));
  return static_cast<int64_t>(st.st_size);
}

void read_exact(const std::string& path, const Fd& file, void* dst, size_t nbytes) {
  if (::pread(file.get(), dst, nbytes, 0) != static_cast<ssize_t>(nbytes))
    throw RuntimeFailure(str(path, ": short read (the file changed while it was read?)"));
}

uint32_t le32(const unsigned char* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

// A file mapped read-only (MAP_SHARED: the pages are the page cache's, never copied), unmapped at
// the end. Nothing is read until a batch touches it.
//
// A mapped file must keep its size: a read of a page past a shrunk file's end is a SIGBUS that kills
// the run without a word (`truncate`, or `cp` over it, which truncates it first). So each read is
// preceded by check_unchanged(), a stat of the path: the mapping keeps the inode alive, so while the
// path names the same device and inode its size is the mapped file's; a path replaced by rename
// names another inode (our mapping still reads the old data, but the run's data changed under it).
// No descriptor is kept open: a dataset of thousands of shards would exhaust the process's limit.
class Mapping {
 public:
  Mapping(const std::string& path, const Fd& file, int64_t size) : size_(static_cast<size_t>(size)) {
    struct stat st;
    if (fstat(file.get(), &st) != 0) throw RuntimeFailure(str(path, ": cannot stat (", std::strerror(errno), ")"));
    dev_ = st.st_dev, ino_ = st.st_ino;
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, file.get(), 0);
    if (p == MAP_FAILED) throw RuntimeFailure(str(path, ": cannot mmap (", std::strerror(errno), ")"));
    base_ = static_cast<const unsigned char*>(p);
    ::madvise(p, size_, MADV_RANDOM);  // batches read short windows: no read-ahead of the whole file
  }
  ~Mapping() { ::munmap(const_cast<unsigned char*>(base_), size_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  const unsigned char* data() const { return base_; }
  // A RuntimeFailure naming `path` when it is no longer the mapped file at its mapped size. A path
  // that is gone (rm) is not a change: the mapping still holds the file (should another holder
  // shrink it still, the read's SIGBUS guard below names it).
  void check_unchanged(const std::string& path) const {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return;
      throw RuntimeFailure(str(path, ": cannot stat the data file while the run reads it (", std::strerror(errno), ")"));
    }
    const bool same_file = st.st_dev == dev_ && st.st_ino == ino_;
    if (same_file && static_cast<size_t>(st.st_size) == size_) return;
    throw RuntimeFailure(str(path, ": the data file changed while the run read it (was ", size_, " bytes, now ",
                             same_file ? "" : "another file of ", st.st_size, " bytes): a file a run reads must not "
                             "be rewritten; write new data under a new name and resume from the last checkpoint"));
  }
  // Drop [at, at + n) from this process's page tables (the page cache keeps it): what a batch read
  // stops counting in the rank's RSS, so RSS stays flat however much of the data a run sweeps.
  void release(size_t at, size_t n) const {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t lo = at / page * page, hi = std::min(size_, (at + n + page - 1) / page * page);
    if (hi > lo) ::madvise(const_cast<unsigned char*>(base_) + lo, hi - lo, MADV_DONTNEED);
  }

 private:
  const unsigned char* base_ = nullptr;
  size_t size_ = 0;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

// A SIGBUS while copy_tokens reads a mapping jumps back to it, which returns false: the race that
// check_unchanged leaves (a file truncated between the check and the read), and a read error of
// the file's device, both of which would otherwise kill the process without a word. The handler is
// installed once, for the process; a SIGBUS anywhere else goes to the disposition it replaced.
thread_local sigjmp_buf* t_sigbus_jump = nullptr;
struct sigaction g_previous_sigbus;

void on_sigbus(int sig, siginfo_t* info, void*) {
  if (sigjmp_buf* jump = t_sigbus_jump) {
    t_sigbus_jump = nullptr;
    siglongjmp(*jump, 1);
  }
  // Not ours: restore the old disposition. A fault re-runs its instruction and faults again under
  // it; a SIGBUS that was sent (kill) is raised again, to be delivered when this returns.
  ::sigaction(sig, &g_previous_sigbus, nullptr);
  if (info->si_code <= 0) ::raise(sig);
}

void install_sigbus_handler() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;  // SIGBUS stays unblocked after the jump
    sigemptyset(&sa.sa_mask);
    return ::sigaction(SIGBUS, &sa, &g_previous_sigbus) == 0;
  }();
  (void)installed;
}

// The files beside a token file: its loss mask (uint8 or bool), its pair ids (DPO) or its
// document ids (SFT under data.document_mask), both int32.
enum class SideFile { mask, pairs, docs };
const char* side_file_name(SideFile k) {
  return k == SideFile::mask ? "loss mask" : k == SideFile::pairs ? "pair ids" : "document ids";
}

// One file of a token stream: its mapping, where its tokens start in it, their count and size
// (1: text bytes, 2: uint16, 4: uint32), and the index of its first token in the whole stream.
struct Segment {
  std::string path;
  std::unique_ptr<Mapping> map;
  int64_t offset = 0, count = 0, token_size = 0, first = 0;

  uint32_t token(int64_t i) const {
    const unsigned char* p = map->data() + offset + i * token_size;
    switch (token_size) {
      case 1: return p[0];
      case 2: return uint32_t(p[0]) | uint32_t(p[1]) << 8;
      default: return le32(p);
    }
  }
};

// Tokens [from, from + n) of `s` into `out`; false when the read raised SIGBUS. Nothing here has
// a destructor for the jump to skip; the signal fences keep the loads between the two stores.
bool copy_tokens(const Segment& s, int64_t from, int64_t n, int64_t* out) {
  sigjmp_buf jump;
  if (sigsetjmp(jump, 0) != 0) return false;
  t_sigbus_jump = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  for (int64_t i = 0; i < n; ++i) out[i] = s.token(from + i);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_sigbus_jump = nullptr;
  return true;
}

// A token stream over mapped files (llm.c shards concatenated, or one text file), read in the
// order of data.h: sequence g is window g mod N (or π_e(g mod N) shuffled) of epoch e = g / N, the
// seq_len + 1 tokens from window·seq_len. Each token read is checked against the vocabulary there
// (a token ≥ vocab_size is a UsageError naming the file and index), so opening a dataset costs its
// headers, not its size. The caller has checked that the stream holds at least one window.
class StreamSource final : public DataSource {
 public:
  // `masks`: none, or one loss mask per segment of the same count (make_masks has checked them).
  // `ids`: none, or one pair-id or document-id file (`ids_kind`) per segment likewise.
  StreamSource(std::vector<Segment> segments, std::vector<Segment> masks, const DataConfig& cfg,
               const std::string& path, int64_t vocab, Order order, std::string description,
               std::vector<Segment> ids = {}, SideFile ids_kind = SideFile::pairs)
      : DataSource(cfg.batch_size), segments_(std::move(segments)), masks_(std::move(masks)), pairs_(std::move(ids)),
        pair_ids_(ids_kind == SideFile::pairs), seq_len_(cfg.seq_len),
        vocab_(vocab), order_(order), path_(path), source_(data_source_name(cfg.source)) {
    install_sigbus_handler();
    AUTOSP_ASSERT(masks_.empty() || masks_.size() == segments_.size(), path, ": ", masks_.size(), " masks for ",
                  segments_.size(), " segments");
    for (const Segment& s : segments_) total_ += s.count;
    windows_ = windows_in(total_, seq_len_);
    AUTOSP_ASSERT(windows_ >= 1, path, ": ", total_, " tokens hold no window of ", seq_len_ + 1);
    description_ = str(description, "; ", windows_, " sequences of ", seq_len_, " per epoch",
                       order_.shuffle ? str(", shuffled each epoch (seed ", order_.seed, ")") : "");
  }

  Batch read(int64_t first, int64_t count) const override {
    check_read_args(first, count);
    const int64_t S = seq_len_;
    std::vector<int64_t> input(static_cast<size_t>(count * S)), labels(input.size());
    std::vector<int64_t> window(static_cast<size_t>(S + 1)), mask(masks_.empty() ? 0 : window.size());
    std::vector<int64_t> pairs(pairs_.empty() ? 0 : input.size()), pair(pairs_.empty() ? 0 : window.size());
    std::vector<int64_t> starts(pairs.size());
    std::vector<char> checked(segments_.size(), 0), checked_masks(masks_.size(), 0);  // files checked unchanged
    std::vector<char> checked_pairs(pairs_.size(), 0);
    for (int64_t b = 0; b < count; ++b) {
      const int64_t at = window_of(first + b) * S;
      read_window(segments_, at, window, checked, vocab_);
      std::copy(window.begin(), window.end() - 1, input.begin() + b * S);
      std::copy(window.begin() + 1, window.end(), labels.begin() + b * S);
      if (!pairs_.empty()) {  // int32 values, read as their uint32 bits
        read_window(pairs_, at, pair, checked_pairs, kNoBound);
        for (int64_t& v : pair) v = static_cast<int32_t>(static_cast<uint32_t>(v));
        for (int64_t t = 0; t < S; ++t) {
          const size_t i = static_cast<size_t>(b * S + t);
          pairs[i] = pair[size_t(t + 1)];
          // The pair (or document) ids delimit the documents: a sequence is a run of one id, a pad
          // (0) is one of its own, and the target of a sequence's last token (the next one's
          // first) is ignored.
          const bool starts_here = t == 0 || pair[size_t(t)] == 0 || pair[size_t(t)] != pair[size_t(t - 1)];
          starts[i] = starts_here ? t : starts[i - 1];
          if (pair[size_t(t + 1)] == 0 || pair[size_t(t + 1)] != pair[size_t(t)]) labels[i] = kIgnore;
        }
      }
      if (masks_.empty()) continue;
      // The label at t predicts token t + 1 of the window: mask[t + 1] = 0 ignores it (HF's
      // labels[t + 1] = -100 before the model's shift). The window's first token is no target.
      read_window(masks_, at, mask, checked_masks, kMaskValues);
      for (int64_t t = 0; t < S; ++t)
        if (mask[static_cast<size_t>(t + 1)] == 0) labels[static_cast<size_t>(b * S + t)] = kIgnore;
    }
    Batch out = make_batch(count, S, std::move(input), std::move(labels));
    if (pairs_.empty()) return out;
    std::vector<int64_t> pos(starts.size());
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int64_t>(i) % S - starts[i];
    if (pair_ids_) out.pair_ids = Tensor::from_vector<int64_t>({count, S}, pairs);
    out.doc_start = Tensor::from_vector<int64_t>({count, S}, starts);
    out.position_ids = Tensor::from_vector<int64_t>({count, S}, pos);
    return out;
  }
  int64_t sequences_per_epoch() const override { return windows_; }
  std::vector<EpochProgress> epochs(int64_t g) const override {
    return {{"", g / windows_, static_cast<double>(g % windows_) / static_cast<double>(windows_)}};
  }
  DataPosition position(int64_t next_sequence) const override {
    return {next_sequence, 0, source_, seq_len_, order_.shuffle, static_cast<int64_t>(order_.seed),
            {{path_, 1, total_}}};
  }
  int64_t num_tokens() const override { return total_; }
  std::string describe() const override { return description_; }

 private:
  // The window sequence g reads: g mod N of epoch g / N, through that epoch's permutation.
  int64_t window_of(int64_t g) const {
    const int64_t i = g % windows_;
    return order_.shuffle ? Permutation(windows_, order_.seed, static_cast<uint64_t>(g / windows_))(i) : i;
  }
  // window.size() values of `segments` (the tokens, or their loss masks) from stream index `at` (a
  // window lies inside the stream), across segment boundaries; every value must be < `bound`
  // (vocab_size, or kMaskValues). Each file is checked unchanged (Mapping::check_unchanged) before
  // the batch first reads it.
  void read_window(const std::vector<Segment>& segments, int64_t at, std::vector<int64_t>& window,
                   std::vector<char>& checked, int64_t bound) const {
    size_t k = segment_of(at);
    int64_t filled = 0;
    const int64_t want = static_cast<int64_t>(window.size());
    while (filled < want) {
      const Segment& s = segments[k];
      if (!checked[k]) s.map->check_unchanged(s.path), checked[k] = 1;
      const int64_t from = at - s.first, len = std::min(want - filled, s.count - from);
      int64_t* out = window.data() + filled;
      if (!copy_tokens(s, from, len, out)) {  // a SIGBUS: the file shrank after the check, or an I/O error
        s.map->check_unchanged(s.path);
        throw RuntimeFailure(str(s.path, ": a read of the mapped data file failed (SIGBUS: the file shrank, or an I/O "
                                 "error)"));
      }
      for (int64_t i = 0; i < len; ++i)
        if (out[i] >= bound)
          throw UsageError(bound == kMaskValues
                               ? str(s.path, ": value ", out[i], " at index ", from + i, " of a loss mask is not 0 or 1")
                               : str(s.path, ": token ", out[i], " at index ", from + i, " is ≥ vocab_size ", bound));
      s.map->release(static_cast<size_t>(s.offset + from * s.token_size), static_cast<size_t>(len * s.token_size));
      filled += len;
      at += len;
      if (at == s.first + s.count) ++k;
    }
  }
  size_t segment_of(int64_t at) const {
    auto it = std::upper_bound(segments_.begin(), segments_.end(), at,
                               [](int64_t v, const Segment& s) { return v < s.first; });
    return static_cast<size_t>(it - segments_.begin()) - 1;
  }

  std::vector<Segment> segments_, masks_;  // masks_: empty, or segments_'s loss masks (same firsts and counts)
  std::vector<Segment> pairs_;             // empty, or segments_'s pair or document ids likewise
  bool pair_ids_;                          // pairs_ are pair ids (the batch carries them), else document ids
  int64_t seq_len_, vocab_, total_ = 0, windows_ = 0;
  Order order_;
  std::string path_, source_, description_;
};

// llm.c shard header: 256 little-endian int32; [0] magic, [1] version, [2] number of tokens.
constexpr int64_t kHeaderInts = 256, kHeaderBytes = kHeaderInts * 4;
constexpr int32_t kMagicU16 = 20240520, kVersionU16 = 1;
constexpr int32_t kMagicU32 = 20240801, kVersionU32 = 7;

// Read and check a shard's header against its file size, then map it; allocates nothing that the
// header sizes.
Segment open_shard(const std::string& path) {
  const Fd file(open_for_read(path));
  const int64_t size = open_regular(path, file);
  if (size == 0) throw UsageError(str(path, ": empty file (expected an llm.c token shard)"));
  if (size < kHeaderBytes)
    throw UsageError(str(path, ": truncated header: the file holds ", size, " bytes, an llm.c shard header is ",
                         kHeaderBytes));
  unsigned char raw[kHeaderBytes];
  read_exact(path, file, raw, sizeof raw);
  const int32_t magic = static_cast<int32_t>(le32(raw)), version = static_cast<int32_t>(le32(raw + 4));
  const int32_t count = static_cast<int32_t>(le32(raw + 8));
  Segment s;
  s.path = path;
  s.offset = kHeaderBytes;
  s.count = count;
  if (magic == kMagicU16) {
    if (version != kVersionU16)
      throw UsageError(str(path, ": unsupported version ", version, " for magic ", magic, " (expected ",
                           kVersionU16, ", uint16 tokens)"));
    s.token_size = 2;
  } else if (magic == kMagicU32) {
    if (version != kVersionU32)
      throw UsageError(str(path, ": unsupported version ", version, " for magic ", magic, " (expected ",
                           kVersionU32, ", uint32 tokens)"));
    s.token_size = 4;
  } else {
    throw UsageError(str(path, ": bad magic ", magic, " (expected ", kMagicU16, " for uint16 tokens or ",
                         kMagicU32, " for uint32 tokens; not an llm.c token shard)"));
  }
  const int64_t data_bytes = size - kHeaderBytes;
  if (count < 0 || count * s.token_size != data_bytes)
    throw UsageError(str(path, ": token count mismatch: the header says ", count, " tokens (",
                         int64_t{count} * s.token_size, " bytes) but the file holds ", data_bytes,
                         " bytes after the header"));
  if (count > 0) s.map = std::make_unique<Mapping>(path, file, size);
  return s;
}

// ---- loss masks ----------------------------------------------------------------------------------

// The text of `key`'s value in a .npy header's dictionary: from after "'key':" up to (not
// including) `stop`, or to just after `stop` when `keep_stop`; "" when the key or `stop` is absent.
// (Plain string search, no std::regex: its recursive matcher can exhaust the stack on long input.)
std::string npy_field(const std::string& header, const std::string& key, char stop, bool keep_stop) {
  size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) return "";
  at = header.find_first_not_of(" ", at + key.size() + 2);
  if (at == std::string::npos || header[at] != ':') return "";
  at = header.find_first_not_of(" ", at + 1);
  if (at == std::string::npos) return "";
  const size_t end = header.find(stop, at + 1);
  return end == std::string::npos ? "" : header.substr(at, end - at + (keep_stop ? 1 : 0));
}

// The header's text for a message: at most 200 characters, anything unprintable as '?'.
std::string printable(const std::string& text) {
  std::string out = text.substr(0, 200);
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  return out;
}

// Read and check the header of the loss mask `path` of token file `tokens` (NumPy's .npy format
// 1.0, 2.0 or 3.0: the magic, a version, the header's length, then a Python dict literal with
// 'descr', 'fortran_order' and 'shape'), then map it like a shard of 1-byte tokens. A mask is one
// dimension of uint8 or bool; its values are checked (0 or 1) when a batch reads them. Pair ids and
// document ids (`ids`) are one dimension of little-endian int32, mapped like 4-byte tokens.
Segment open_mask(const std::string& path, const std::string& tokens, SideFile kind = SideFile::mask) {
  const bool pairs = kind != SideFile::mask;
  const std::string of = str(" (the ", side_file_name(kind), " of ", tokens, ")");
  const Fd file(open_for_read(path));
  const int64_t size = open_regular(path, file);
  constexpr int64_t kMaxHeader = 1 << 16;  // NumPy itself refuses headers over 10000 bytes
  std::vector<unsigned char> raw(static_cast<size_t>(std::min(size, kMaxHeader + 12)));
  if (!raw.empty()) read_exact(path, file, raw.data(), raw.size());
  static const unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (size < 10 || std::memcmp(raw.data(), kMagic, 6) != 0)
    throw UsageError(str(path, ": not a .npy file (no \\x93NUMPY magic)", of));
  const int major = raw[6], minor = raw[7];
  if (major < 1 || major > 3 || minor != 0)
    throw UsageError(str(path, ": unsupported .npy version ", major, ".", minor, " (expected 1.0, 2.0 or 3.0)", of));
  const int64_t prefix = major == 1 ? 10 : 12;
  if (size < prefix) throw UsageError(str(path, ": truncated .npy header", of));
  const int64_t header_len = major == 1 ? int64_t{raw[8]} | int64_t{raw[9]} << 8 : int64_t{le32(raw.data() + 8)};
  if (header_len > kMaxHeader || prefix + header_len > size)
    throw UsageError(str(path, ": truncated .npy header (", header_len, " header bytes in a file of ", size, ")", of));
  const std::string header(raw.begin() + prefix, raw.begin() + prefix + header_len);
  const std::string descr = npy_field(header, "descr", '\'', true);           // 'u1' with its quotes
  const std::string fortran = npy_field(header, "fortran_order", ',', false);  // True or False
  const std::string shape = npy_field(header, "shape", ')', true);            // (n,) with its parentheses
  if (header.find('{') == std::string::npos || descr.size() < 2 || descr[0] != '\'' ||
      (fortran != "True" && fortran != "False") || shape.empty() || shape[0] != '(')
    throw UsageError(str(path, ": malformed .npy header '", printable(header),
                         "' (expected {'descr': ..., 'fortran_order': ..., 'shape': (...)})", of));
  const std::string dtype = descr.substr(1, descr.size() - 2);
  if (pairs && dtype != "<i4")
    throw UsageError(str(path, ": dtype '", printable(dtype), "': ", side_file_name(kind),
                         " are little-endian int32 ('<i4')", of));
  if (!pairs && dtype != "|u1" && dtype != "u1" && dtype != "<u1" && dtype != ">u1" && dtype != "|b1" && dtype != "b1")
    throw UsageError(str(path, ": dtype '", printable(dtype), "': a loss mask is uint8 ('|u1') or bool ('|b1')", of));
  // (n,): digits, then a comma, nothing else but spaces.
  const std::string inner = shape.substr(1, shape.size() - 2);
  const size_t d0 = inner.find_first_not_of(' '), d1 = inner.find_first_not_of("0123456789", d0);
  const bool one_dim = d0 != std::string::npos && d1 != std::string::npos && d1 > d0 && d1 - d0 <= 18 &&
                       inner[d1] == ',' && inner.find_first_not_of(' ', d1 + 1) == std::string::npos;
  if (!one_dim) throw UsageError(str(path, ": shape ", printable(shape), ": a loss mask has one dimension, (n,)", of));
  Segment s;
  s.path = path;
  s.offset = prefix + header_len;
  s.count = std::stoll(inner.substr(d0, d1 - d0));
  s.token_size = pairs ? 4 : 1;
  if (s.count != (size - s.offset) / s.token_size || (size - s.offset) % s.token_size != 0)
    throw UsageError(str(path, ": shape (", s.count, ",) but the file holds ", size - s.offset,
                         " bytes of data after its header", of));
  if (s.count > 0) s.map = std::make_unique<Mapping>(path, file, size);
  return s;
}

// The loss masks of `segments` (the token files of `path`, opened in sorted order, empty ones
// included) from the files `mask_path` names, paired in sorted order: equal numbers of files, and
// each mask as long as its token file. Masks of empty files are dropped with them.
std::vector<Segment> make_masks(const std::string& mask_path, const std::string& path,
                                const std::vector<Segment>& files, SideFile kind = SideFile::mask) {
  if (mask_path.empty()) return {};
  const std::vector<std::string> names = expand_path(mask_path);
  const char* what = kind == SideFile::pairs ? " pair-id file" : kind == SideFile::docs ? " document-id file" : " loss mask";
  if (names.size() != files.size())
    throw UsageError(str(mask_path, ": ", names.size(), what, names.size() == 1 ? "" : "s", " for the ",
                         files.size(), files.size() == 1 ? " token file" : " token files", " of ", path,
                         " (one per file, in the same sorted order)"));
  std::vector<Segment> masks;
  for (size_t k = 0; k < names.size(); ++k) {
    Segment m = open_mask(names[k], files[k].path, kind);
    if (m.count != files[k].count)
      throw UsageError(str(names[k], ": the", what, " holds ", m.count, " values but its token file ", files[k].path,
                           " holds ", files[k].count, " tokens"));
    if (m.count == 0) continue;
    m.first = files[k].first;
    masks.push_back(std::move(m));
  }
  return masks;
}

std::unique_ptr<DataSource> make_tokens_source(const DataConfig& cfg, const std::string& path,
                                               const std::string& mask_path, int64_t vocab_size, Order order,
                                               const std::string& ids_path = "", SideFile ids_kind = SideFile::pairs) {
  if (path.empty()) throw UsageError("data.path: required for data.source 'tokens'");
  std::vector<Segment> files, shards;
  int64_t total = 0;
  bool u16 = false, u32 = false;
  for (const std::string& file : expand_path(path)) {
    Segment s = open_shard(file);
    (s.token_size == 2 ? u16 : u32) = true;
    s.first = total;
    total += s.count;
    files.push_back(std::move(s));
  }
  std::vector<Segment> masks = make_masks(mask_path, path, files);
  std::vector<Segment> ids = make_masks(ids_path, path, files, ids_kind);
  for (Segment& s : files)
    if (s.count > 0) shards.push_back(std::move(s));  // an empty shard adds nothing to the stream
  if (total < cfg.seq_len + 1)
    throw UsageError(str(path, ": the token stream holds ", total, " tokens, fewer than seq_len + 1 = ",
                         cfg.seq_len + 1));
  const char* kind = u16 && u32 ? "uint16 and uint32" : u16 ? "uint16" : "uint32";
  std::string desc = str("tokens: ", shards.size(), shards.size() == 1 ? " shard, " : " shards, ", total,
                         " tokens (", kind, ") from ", path, mask_path.empty() ? "" : ", loss masks from " + mask_path,
                         ids_path.empty() ? "" : str(", ", side_file_name(ids_kind), " from ", ids_path));
  return std::make_unique<StreamSource>(std::move(shards), std::move(masks), cfg, path, vocab_size, order,
                                        std::move(desc), std::move(ids), ids_kind);
}

std::unique_ptr<DataSource> make_text_source(const DataConfig& cfg, const std::string& path,
                                             const std::string& mask_path, int64_t vocab_size, Order order) {
  if (path.empty()) throw UsageError("data.path: required for data.source 'text'");
  if (vocab_size < 256)
    throw UsageError(str(path, ": the text source uses bytes as tokens and needs vocab_size ≥ 256, got ",
                         vocab_size));
  const Fd file(open_for_read(path));
  const int64_t size = open_regular(path, file);
  if (size == 0) throw UsageError(str(path, ": empty file"));
  if (size < cfg.seq_len + 1)
    throw UsageError(str(path, ": the text holds ", size, " bytes, fewer than seq_len + 1 = ", cfg.seq_len + 1));
  std::vector<Segment> one(1);
  one[0].path = path;
  one[0].map = std::make_unique<Mapping>(path, file, size);
  one[0].count = size;
  one[0].token_size = 1;
  std::vector<Segment> masks = make_masks(mask_path, path, one);
  return std::make_unique<StreamSource>(std::move(one), std::move(masks), cfg, path, vocab_size, order,
                                        str("text: ", size, " bytes from ", path,
                                            mask_path.empty() ? "" : ", loss masks from " + mask_path));
}

// ---- a weighted mix ----------------------------------------------------------------------------

// data.mix: sequence g is sequence j of dataset k by the schedule of the weights (data_order.h);
// each dataset is a StreamSource with its own epochs and shuffle key.
class MixSource final : public DataSource {
 public:
  MixSource(const DataConfig& cfg, std::vector<std::unique_ptr<DataSource>> streams, const std::vector<double>& weights,
            uint64_t seed)
      : DataSource(cfg.batch_size), streams_(std::move(streams)), weights_(weights), schedule_(weights),
        seq_len_(cfg.seq_len), shuffle_(cfg.shuffle), seed_(seed) {
    for (size_t k = 0; k < streams_.size(); ++k) paths_.push_back(cfg.mix[k].path);
  }

  Batch read(int64_t first, int64_t count) const override {
    check_read_args(first, count);
    const int64_t S = seq_len_;
    std::vector<int64_t> input(static_cast<size_t>(count * S)), labels(input.size()), pos(input.size()), starts;
    for (int64_t b = 0; b < count; ++b) {
      const MixSchedule::Slot slot = schedule_.at(first + b);
      const Batch one = streams_[static_cast<size_t>(slot.dataset)]->read(slot.index, 1);
      std::copy_n(one.input_ids.data<int64_t>(), S, input.begin() + b * S);
      std::copy_n(one.labels.data<int64_t>(), S, labels.begin() + b * S);
      std::copy_n(one.position_ids.contiguous().data<int64_t>(), S, pos.begin() + b * S);
      if (!one.doc_start.defined()) continue;  // under data.document_mask every dataset marks its documents
      starts.resize(input.size());
      std::copy_n(one.doc_start.contiguous().data<int64_t>(), S, starts.begin() + b * S);
    }
    Batch out = make_batch(count, S, std::move(input), std::move(labels));
    out.position_ids = Tensor::from_vector<int64_t>({count, S}, pos);
    if (!starts.empty()) out.doc_start = Tensor::from_vector<int64_t>({count, S}, starts);
    return out;
  }
  int64_t sequences_per_epoch() const override { return 0; }  // each dataset has its own
  std::vector<EpochProgress> epochs(int64_t g) const override {
    std::vector<EpochProgress> out;
    for (size_t k = 0; k < streams_.size(); ++k) {
      const int64_t j = schedule_.count_before(static_cast<int64_t>(k), g), n = streams_[k]->sequences_per_epoch();
      out.push_back({paths_[k], j / n, static_cast<double>(j % n) / static_cast<double>(n)});
    }
    return out;
  }
  DataPosition position(int64_t next_sequence) const override {
    DataPosition p = streams_.front()->position(next_sequence);
    p.seed = static_cast<int64_t>(seed_);
    p.shuffle = shuffle_;
    p.datasets.clear();
    for (size_t k = 0; k < streams_.size(); ++k)
      p.datasets.push_back({paths_[k], weights_[k], streams_[k]->num_tokens()});
    return p;
  }
  int64_t num_tokens() const override {
    int64_t n = 0;
    for (const auto& s : streams_) n += s->num_tokens();
    return n;
  }
  std::string describe() const override {
    std::string d = str("mix of ", streams_.size(), " datasets:");
    for (size_t k = 0; k < streams_.size(); ++k)
      d += str(k ? ";" : "", " ", schedule_.slots(static_cast<int64_t>(k)) / 100.0, "% ", streams_[k]->describe());
    return d;
  }

 private:
  std::vector<std::unique_ptr<DataSource>> streams_;
  std::vector<double> weights_;
  std::vector<std::string> paths_;
  MixSchedule schedule_;
  int64_t seq_len_;
  bool shuffle_;
  uint64_t seed_;
};

// ---- synthetic associative recall -------------------------------------------------------------

// splitmix64: a counter-based generator, so a sequence depends only on (seed, global index).
struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

// Each sequence is L = seq_len + 1 tokens (input = the first seq_len, labels = the last seq_len,
// as for the token streams):
//
//   position  0     1         …  n         n+1  …  L-2n-2   L-2n-1   L-2n     L-2n+1   …  L-2  L-1
//   token     BOS   (k1,v1)   …  (kn,vn)   PAD  …  PAD      SEP      k_π1     v_π1     …  k_πn v_πn
//
// m = floor(√(vocab − 2)) − 1 keys [3, 3 + m) and m values [3 + m, 3 + 2m); each pair (k, v) of the
// first half is one token, 3 + 2m + i·m + j for key i and value j (m² of them), so a sequence binds
// n = min(m, (L − 2) / 4) distinct keys to values (values may repeat). The queries repeat the pairs
// as two tokens, key then value, in a shuffled order π, ending at the last token; any remainder is
// PAD between the pairs and SEP. The label at input position p is token p+1 only where p holds a
// query key (its label is that key's value); every other label is -100. The pairs sit in the first
// half and their queries in the second, so at P = 2 every answer is in the other rank's shard, and
// one attention layer can look it up (the key's token to its pair's); binding key and value in
// separate tokens instead needs two composed heads (an induction circuit), which the default job
// did not learn in its two minutes (docs/decisions.md 62).
class SyntheticSource final : public DataSource {
 public:
  static constexpr int64_t kPad = 0, kBos = 1, kSep = 2, kFirstKey = 3;

  SyntheticSource(const DataConfig& cfg, int64_t vocab_size, uint64_t seed)
      : DataSource(cfg.batch_size), seq_len_(cfg.seq_len), vocab_(vocab_size), seed_(seed) {
    if (vocab_size < 16)
      throw UsageError(str("model.vocab_size: the synthetic data needs ≥ 16, got ", vocab_size));
    if (cfg.seq_len < 8) throw UsageError(str("data.seq_len: the synthetic data needs ≥ 8, got ", cfg.seq_len));
    num_keys_ = 1;  // the largest m with 3 + 2m + m² ≤ vocab, i.e. (m + 1)² ≤ vocab − 2
    while ((num_keys_ + 2) * (num_keys_ + 2) <= vocab_size - 2) ++num_keys_;
    pairs_ = std::min(num_keys_, (seq_len_ + 1 - 2) / 4);
  }

  Batch read(int64_t first, int64_t count) const override {
    check_read_args(first, count);
    const int64_t S = seq_len_;
    std::vector<int64_t> input(static_cast<size_t>(count * S)), labels(input.size());
    std::vector<int64_t> seq(static_cast<size_t>(S + 1));
    for (int64_t b = 0; b < count; ++b) {
      const int64_t first_query = generate(static_cast<uint64_t>(first + b), seq);
      std::copy(seq.begin(), seq.begin() + S, input.begin() + b * S);
      int64_t* lab = labels.data() + b * S;
      std::fill(lab, lab + S, kIgnore);
      for (int64_t p = first_query; p < S; p += 2) lab[p] = seq[static_cast<size_t>(p + 1)];
    }
    return make_batch(count, S, std::move(input), std::move(labels));
  }
  int64_t sequences_per_epoch() const override { return 0; }  // endless
  std::vector<EpochProgress> epochs(int64_t) const override { return {}; }
  DataPosition position(int64_t next_sequence) const override {
    return {next_sequence, 0, "synthetic", seq_len_, false, static_cast<int64_t>(seed_), {{"", 1, 0}}};
  }
  int64_t num_tokens() const override { return 0; }
  std::string describe() const override {
    const int64_t m = num_keys_, first_pair = kFirstKey + 2 * m;
    return str("synthetic: associative recall, ", pairs_, " key-value pairs per sequence of ", seq_len_,
               " (keys ", kFirstKey, "..", kFirstKey + m - 1, ", values ", kFirstKey + m, "..", first_pair - 1,
               ", pair tokens ", first_pair, "..", first_pair + m * m - 1, ")");
  }

 private:
  // Fill `seq` (L = seq_len + 1 tokens) for one global sequence index; returns the position of the
  // first query key.
  int64_t generate(uint64_t global, std::vector<int64_t>& seq) const {
    SplitMix64 seeder{seed_ ^ 0x5DEECE66Dull};
    SplitMix64 rng{seeder.next() ^ (global * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull)};
    rng.next();
    const int64_t L = static_cast<int64_t>(seq.size()), n = pairs_, m = num_keys_;
    std::vector<int64_t> keys, values(static_cast<size_t>(n)), order(static_cast<size_t>(n));
    std::vector<char> used(static_cast<size_t>(m), 0);
    while (static_cast<int64_t>(keys.size()) < n) {  // distinct keys by rejection (n ≤ m)
      const int64_t k = rng.below(m);
      if (!used[static_cast<size_t>(k)]) used[static_cast<size_t>(k)] = 1, keys.push_back(k);
    }
    for (auto& v : values) v = rng.below(m);
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
    for (int64_t i = n - 1; i > 0; --i) std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(rng.below(i + 1))]);

    std::fill(seq.begin(), seq.end(), kPad);
    seq[0] = kBos;
    for (int64_t i = 0; i < n; ++i)
      seq[static_cast<size_t>(1 + i)] = kFirstKey + 2 * m + keys[static_cast<size_t>(i)] * m + values[static_cast<size_t>(i)];
    const int64_t first_query = L - 2 * n;
    seq[static_cast<size_t>(first_query - 1)] = kSep;
    for (int64_t j = 0; j < n; ++j) {
      const size_t i = static_cast<size_t>(order[static_cast<size_t>(j)]);
      seq[static_cast<size_t>(first_query + 2 * j)] = kFirstKey + keys[i];
      seq[static_cast<size_t>(first_query + 2 * j + 1)] = kFirstKey + m + values[i];
    }
    return first_query;
  }

  int64_t seq_len_, vocab_;
  uint64_t seed_;
  int64_t num_keys_ = 0, pairs_ = 0;
};

template <class T>
std::pair<int64_t, int64_t> count_correct_as(const Tensor& logits, const std::vector<int64_t>& labels, int64_t V) {
  const T* x = logits.data<T>();
  int64_t correct = 0, total = 0;
  for (size_t r = 0; r < labels.size(); ++r) {
    if (labels[r] == kIgnore) continue;
    ++total;
    const T* row = x + static_cast<int64_t>(r) * V;
    const int64_t best = std::max_element(row, row + V) - row;  // first maximum on ties
    correct += best == labels[r];
  }
  return {correct, total};
}

}  // namespace

Batch DataSource::get(int64_t step, int64_t dp_rank, int64_t dp_size) const {
  AUTOSP_ASSERT(step >= 0 && dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size, "data: step ", step, ", dp rank ",
                dp_rank, " of ", dp_size);
  int64_t first = 0;
  if (__builtin_mul_overflow(step, dp_size, &first) || __builtin_add_overflow(first, dp_rank, &first) ||
      __builtin_mul_overflow(first, batch_, &first) || first > INT64_MAX - batch_)
    throw UsageError(str("data: step ", step, " × dp ", dp_size, " × batch ", batch_,
                         " sequences is past 2^63: the run is too long for its sequence index"));
  return read(first, batch_);
}

std::vector<std::string> expand_path(const std::string& pattern) {
  std::error_code ec;
  if (std::filesystem::exists(pattern, ec) || pattern.find_first_of("*?[") == std::string::npos)
    return {pattern};
  glob_t g;
  const int rc = glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  if (rc == GLOB_NOSPACE) throw RuntimeFailure(str(pattern, ": out of memory expanding the glob"));
  if (rc != 0 && rc != GLOB_NOMATCH) throw UsageError(str(pattern, ": cannot expand the glob (read error)"));
  if (files.empty()) throw UsageError(str(pattern, ": no file matches the pattern"));
  std::sort(files.begin(), files.end());
  return files;
}


namespace {
// The files of one stream: its tokens (data.path, a data.mix entry or data.val_path), their loss
// masks, pair ids and document ids ("" = none).
struct StreamFiles {
  std::string path, mask_path, pairs_path, doc_ids_path;
};

// The token stream of `f`, or the synthetic task, with its documents marked under
// data.document_mask: by the pair ids (always: DPO's sequences are its documents) or the document
// ids when it has them, else by the EOS tokens.
std::unique_ptr<DataSource> make_stream(const DataConfig& cfg, const StreamFiles& f, int64_t vocab_size, uint64_t seed,
                                        Order order) {
  const bool pairs = !f.pairs_path.empty();
  const std::string ids = pairs ? f.pairs_path : cfg.document_mask ? f.doc_ids_path : "";
  std::unique_ptr<DataSource> source;
  switch (cfg.source) {
    case DataSourceKind::synthetic: source = std::make_unique<SyntheticSource>(cfg, vocab_size, seed); break;
    case DataSourceKind::tokens:
      source = make_tokens_source(cfg, f.path, f.mask_path, vocab_size, order, ids,
                                  pairs ? SideFile::pairs : SideFile::docs);
      break;
    case DataSourceKind::text: source = make_text_source(cfg, f.path, f.mask_path, vocab_size, order); break;
  }
  AUTOSP_ASSERT(source, "data.source ", static_cast<int>(cfg.source));
  if (!cfg.document_mask || !ids.empty()) return source;
  if (cfg.eos_token_id < 0 || cfg.eos_token_id >= vocab_size)
    throw UsageError(str("data.document_mask needs data.eos_token_id in [0, ", vocab_size, "), got ", cfg.eos_token_id));
  return std::make_unique<DocumentSource>(std::move(source), cfg.eos_token_id);
}
}  // namespace

std::unique_ptr<DataSource> make_data_source(const DataConfig& cfg, int64_t vocab_size, uint64_t seed) {
  check_sizes(cfg, vocab_size);
  const Order order{cfg.shuffle, cfg.seed >= 0 ? static_cast<uint64_t>(cfg.seed) : seed};
  if (cfg.mix.empty())
    return make_stream(cfg, {cfg.path, cfg.loss_mask_path, cfg.pairs_path, cfg.doc_ids_path}, vocab_size, seed, order);
  if (cfg.source == DataSourceKind::synthetic)
    throw UsageError("data.mix does not apply to data.source \"synthetic\"");
  std::vector<std::unique_ptr<DataSource>> streams;
  std::vector<double> weights;
  for (size_t k = 0; k < cfg.mix.size(); ++k) {
    if (cfg.mix[k].path.empty()) throw UsageError(str("data.mix[", k, "].path: expected a file or a glob"));
    const Order own{order.shuffle, dataset_seed(order.seed, static_cast<int64_t>(k))};
    streams.push_back(make_stream(cfg, {cfg.mix[k].path, cfg.mix[k].loss_mask_path, "", cfg.mix[k].doc_ids_path},
                                  vocab_size, seed, own));
    weights.push_back(cfg.mix[k].weight);
  }
  return std::make_unique<MixSource>(cfg, std::move(streams), weights, order.seed);
}

std::vector<std::string> data_input_paths(const DataConfig& cfg) {
  std::vector<std::string> paths;
  if (cfg.source == DataSourceKind::synthetic) return paths;
  if (!cfg.path.empty()) paths.push_back(cfg.path);
  for (const DataMixEntry& e : cfg.mix) paths.push_back(e.path);
  if (!cfg.val_path.empty()) paths.push_back(cfg.val_path);
  for (const DataMixEntry& e : cfg.mix)
    for (const std::string* m : {&e.loss_mask_path, &e.doc_ids_path})
      if (!m->empty()) paths.push_back(*m);
  for (const std::string* m : {&cfg.loss_mask_path, &cfg.val_loss_mask_path, &cfg.pairs_path, &cfg.val_pairs_path,
                               &cfg.doc_ids_path, &cfg.val_doc_ids_path})
    if (!m->empty()) paths.push_back(*m);
  return paths;
}

void mark_documents(Batch& b, int64_t eos) {
  const Tensor ids = b.input_ids.contiguous();
  AUTOSP_ASSERT(ids.dtype() == DType::i64 && ids.rank() == 2 && b.labels.dtype() == DType::i64 &&
                    b.labels.shape() == ids.shape(), "mark_documents: input_ids ", ids.str(), ", labels ", b.labels.str());
  const int64_t B = ids.dim(0), S = ids.dim(1);
  const int64_t* in = ids.data<int64_t>();
  const Tensor lab = b.labels.contiguous();
  std::vector<int64_t> labels(lab.data<int64_t>(), lab.data<int64_t>() + lab.numel());
  std::vector<int64_t> start(static_cast<size_t>(B * S)), pos(start.size());
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < S; ++t) {
      const size_t i = static_cast<size_t>(r * S + t);
      start[i] = t == 0 || in[i - 1] == eos ? t : start[i - 1];  // a document starts after each EOS
      pos[i] = t - start[i];
      if (in[i] == eos) labels[i] = kIgnore;  // an EOS's target is the next document's first token
    }
  b.labels = Tensor::from_vector<int64_t>({B, S}, labels);
  b.position_ids = Tensor::from_vector<int64_t>({B, S}, pos);
  b.doc_start = Tensor::from_vector<int64_t>({B, S}, start);
}

void check_doc_start(const Tensor& doc_start) {
  const Tensor d = doc_start.contiguous();
  AUTOSP_ASSERT(d.dtype() == DType::i64 && d.rank() == 2, "doc_start ", d.str(), ": expected i64 [batch, seq_len]");
  const int64_t B = d.dim(0), S = d.dim(1);
  const int64_t* s = d.data<int64_t>();
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < S; ++t) {
      const int64_t v = s[r * S + t];
      if (v < 0 || v > t)
        throw UsageError(str("doc_start of row ", r, " at position ", t, " is ", v,
                             ": a document starts at or before its token, at 0 or later"));
      if (t > 0 && v < s[r * S + t - 1])
        throw UsageError(str("doc_start of row ", r, " falls from ", s[r * S + t - 1], " to ", v, " at position ", t,
                             ": document starts never decrease along the sequence"));
    }
}

std::unique_ptr<DataSource> make_val_source(const DataConfig& cfg, int64_t vocab_size, uint64_t seed) {
  check_sizes(cfg, vocab_size);
  // Synthetic: a stream no training seed reaches but by a 2^-64 chance.
  return make_stream(cfg, {cfg.val_path, cfg.val_loss_mask_path, cfg.val_pairs_path, cfg.val_doc_ids_path}, vocab_size,
                     seed ^ 0x7A1DA7E5EED0F00Dull, Order{});
}

void set_token_index(Batch& b, int64_t first) {
  const int64_t B = b.input_ids.dim(0), S = b.input_ids.dim(1);
  std::vector<int64_t> index(static_cast<size_t>(B * S));
  for (int64_t i = 0; i < B; ++i)
    for (int64_t t = 0; t < S; ++t) index[static_cast<size_t>(i * S + t)] = (first + i) * S + t;
  b.token_index = Tensor::from_vector<int64_t>({B, S}, index);
}

Batch pad_to_multiple(const Batch& b, int64_t p) {
  const int64_t B = b.input_ids.dim(0), S = b.input_ids.dim(1), Sp = (S + p - 1) / p * p;
  if (Sp == S) return b;
  auto pad = [&](const Tensor& t, int64_t fill) {
    const Tensor in = t.contiguous();
    Tensor out = Tensor::empty({B, Sp}, DType::i64);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t j = 0; j < Sp; ++j) out.data<int64_t>()[i * Sp + j] = j < S ? in.data<int64_t>()[i * S + j] : fill;
    return out;
  };
  Batch out{pad(b.input_ids, 0), pad(b.labels, kIgnore), pad(b.position_ids, 0)};
  if (b.doc_start.defined()) out.doc_start = pad(b.doc_start, S);
  if (b.token_index.defined()) out.token_index = pad(b.token_index, -1);  // the padding's mask never matters
  if (b.pair_ids.defined()) out.pair_ids = pad(b.pair_ids, 0);
  return out;
}

std::map<std::string, Tensor> batch_feeds(const Batch& b) {
  std::map<std::string, Tensor> feeds = {
      {"input_ids", b.input_ids}, {"labels", b.labels}, {"position_ids", b.position_ids}};
  if (b.doc_start.defined()) feeds["doc_start"] = b.doc_start;
  if (b.token_index.defined()) feeds["token_index"] = b.token_index;
  return feeds;
}

std::string format_example(const std::vector<int64_t>& input, const std::vector<int64_t>& labels,
                           const std::vector<int64_t>& predicted) {
  AUTOSP_ASSERT(input.size() == labels.size() && labels.size() == predicted.size(), "format_example: sizes");
  const size_t first = static_cast<size_t>(
      std::find_if(labels.begin(), labels.end(), [](int64_t l) { return l != kIgnore; }) - labels.begin());
  std::string context, answers;
  for (size_t i = 0; i < first && i < input.size(); ++i) context += str(i ? " " : "", input[i]);
  int64_t right = 0, scored = 0;
  for (size_t i = first; i < labels.size(); ++i) {
    if (labels[i] == kIgnore) continue;
    ++scored;
    right += predicted[i] == labels[i];
    answers += str(answers.empty() ? "" : " ", input[i], "→", predicted[i]);
    if (predicted[i] != labels[i]) answers += str(" (want ", labels[i], ")");
  }
  return str("context [", context, "] answers [", answers, "] ", right, "/", scored, " right");
}

// logits [rows, V] (any leading dims whose product is rows), labels [rows] (i64 or i32).
std::pair<int64_t, int64_t> count_correct(const Tensor& logits, const Tensor& labels) {
  AUTOSP_ASSERT(logits.device().kind == DeviceKind::cpu && labels.device().kind == DeviceKind::cpu,
                "count_correct: CPU tensors only");
  AUTOSP_ASSERT(logits.rank() >= 1 && logits.is_contiguous(), "count_correct: logits ", logits.str());
  AUTOSP_ASSERT(labels.dtype() == DType::i64 || labels.dtype() == DType::i32, "count_correct: labels ",
                labels.str());
  std::vector<int64_t> lab;
  lab.reserve(static_cast<size_t>(labels.numel()));
  for (double v : labels.to_doubles()) lab.push_back(static_cast<int64_t>(v));
  if (logits.dtype() == DType::i64) {  // the argmax already (runtime.tiled_loss's predictions)
    AUTOSP_ASSERT(logits.numel() == labels.numel(), "count_correct: predictions ", logits.str(), " vs labels ",
                  labels.str());
    const int64_t* pred = logits.data<int64_t>();
    int64_t correct = 0, total = 0;
    for (size_t r = 0; r < lab.size(); ++r)
      if (lab[r] != kIgnore) ++total, correct += pred[r] == lab[r];
    return {correct, total};
  }
  const int64_t V = logits.dim(-1);
  AUTOSP_ASSERT(V >= 1 && logits.numel() == labels.numel() * V, "count_correct: logits ", logits.str(),
                " vs labels ", labels.str());
  if (logits.dtype() == DType::f32) return count_correct_as<float>(logits, lab, V);
  if (logits.dtype() == DType::bf16) return count_correct_as<float>(logits.to(DType::f32), lab, V);  // exact
  AUTOSP_ASSERT(logits.dtype() == DType::f64, "count_correct: logits must be f32, f64 or bf16, got ", logits.str());
  return count_correct_as<double>(logits, lab, V);
}

}  // namespace autosp
