// The CPU emulation of the CUDA kernels (emulation.h): scratch is host memory from malloc, in
// place of common.cu's stream-ordered device allocations; the cuBLASLt GEMMs (matmul.cuh) are host
// loops with cuBLASLt's numerics; and the static `__shared__` arrays of a kernel are found in this
// executable's ELF symbol table.
#include <elf.h>
#include <link.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cuda/emulation.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/matmul.cuh"

namespace autosp::cuda {

Scratch::Scratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
  if (bytes > 0) ptr_ = std::malloc(bytes);
}

Scratch::~Scratch() { std::free(ptr_); }

namespace {

// C = alpha·op(A)·op(B) + beta·C as cuBLASLt computes it (matmul.cuh's row-major contract): each
// product summed over K in acc_t<T> (f32 for f32 and bf16 inputs, f64 for f64), alpha·sum + beta·C
// in that type (C widened from its storage, not read when beta is 0), rounded once to C's type.
template <class T, class TC>
void host_gemm(bool ta, bool tb, int64_t batch, int64_t M, int64_t N, int64_t K, double alpha, const T* a,
               int64_t sa, const T* b, int64_t sb, double beta, TC* c, int64_t sc) {
  using A = acc_t<T>;
  for (int64_t p = 0; p < batch; ++p) {
    const T* ap = a + p * sa;
    const T* bp = b + p * sb;
    TC* cp = c + p * sc;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        A sum = 0;
        for (int64_t k = 0; k < K; ++k)
          sum += to_acc(ta ? ap[k * M + m] : ap[m * K + k]) * to_acc(tb ? bp[n * K + k] : bp[k * N + n]);
        A r = A(alpha) * sum;
        if (beta != 0.0) r += A(beta) * A(to_acc(cp[m * N + n]));
        cp[m * N + n] = from_acc<TC>(r);
      }
  }
}

}  // namespace

template <class T>
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K, double alpha, const T* a,
                  int64_t stride_a, const T* b, int64_t stride_b, double beta, T* c, int64_t stride_c, cudaStream_t) {
  host_gemm<T, T>(trans_a, trans_b, batch, M, N, K, alpha, a, stride_a, b, stride_b, beta, c, stride_c);
}
template void gemm_batched<float>(bool, bool, int64_t, int64_t, int64_t, int64_t, double, const float*, int64_t,
                                  const float*, int64_t, double, float*, int64_t, cudaStream_t);
template void gemm_batched<double>(bool, bool, int64_t, int64_t, int64_t, int64_t, double, const double*, int64_t,
                                   const double*, int64_t, double, double*, int64_t, cudaStream_t);
template void gemm_batched<bf16>(bool, bool, int64_t, int64_t, int64_t, int64_t, double, const bf16*, int64_t,
                                 const bf16*, int64_t, double, bf16*, int64_t, cudaStream_t);

void gemm_bf16_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const bf16* a,
                   const bf16* b, double beta, float* c, cudaStream_t) {
  host_gemm<bf16, float>(trans_a, trans_b, 1, M, N, K, alpha, a, 0, b, 0, beta, c, 0);
}

}  // namespace autosp::cuda

namespace emu {
namespace {

// The main executable's functions (by run-time address) and its static local objects (by
// mangled name), from /proc/self/exe's .symtab, which test binaries keep.
struct Symbols {
  std::unordered_map<uintptr_t, std::string> functions;
  std::map<std::string, StaticShared> statics;  // sorted: a kernel's statics share a name prefix
};

uintptr_t load_bias() {
  uintptr_t bias = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        *static_cast<uintptr_t*>(out) = info->dlpi_addr;
        return 1;  // the first object is the executable
      },
      &bias);
  return bias;
}

Symbols read_symbols() {
  Symbols out;
  std::ifstream f("/proc/self/exe", std::ios::binary);
  const std::string elf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (elf.size() < sizeof(Elf64_Ehdr) || elf.compare(0, 4, ELFMAG) != 0)
    throw std::runtime_error("emulation: cannot read this executable's ELF header");
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(elf.data());
  const auto* sections = reinterpret_cast<const Elf64_Shdr*>(elf.data() + eh->e_shoff);
  const uintptr_t bias = load_bias();
  for (int i = 0; i < eh->e_shnum; ++i) {
    if (sections[i].sh_type != SHT_SYMTAB) continue;
    const char* names = elf.data() + sections[sections[i].sh_link].sh_offset;
    const auto* syms = reinterpret_cast<const Elf64_Sym*>(elf.data() + sections[i].sh_offset);
    for (size_t k = 0; k < sections[i].sh_size / sizeof(Elf64_Sym); ++k) {
      const Elf64_Sym& s = syms[k];
      const std::string name = names + s.st_name;
      if (ELF64_ST_TYPE(s.st_info) == STT_FUNC && s.st_value)
        out.functions.emplace(bias + s.st_value, name);
      else if (ELF64_ST_TYPE(s.st_info) == STT_OBJECT && name.starts_with("_ZZ") && s.st_size)
        out.statics[name] = {reinterpret_cast<unsigned char*>(bias + s.st_value), s.st_size};
    }
  }
  if (out.functions.empty()) throw std::runtime_error("emulation: this executable has no symbol table (stripped?)");
  return out;
}

}  // namespace

const std::vector<StaticShared>& static_shared_of(const void* kernel) {
  static const std::vector<StaticShared> none;
  if (!kernel) return none;
  static std::mutex mu;
  static std::unordered_map<const void*, std::vector<StaticShared>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(kernel); it != cache.end()) return it->second;
  static const Symbols symbols = read_symbols();
  std::vector<StaticShared>& found = cache[kernel];
  const auto fn = symbols.functions.find(reinterpret_cast<uintptr_t>(kernel));
  if (fn == symbols.functions.end() || !fn->second.starts_with("_Z")) return found;  // not a C++ kernel: none known
  // A static local of function _Z<encoding> is _ZZ<encoding>E<name>[_<discriminator>].
  const std::string prefix = "_ZZ" + fn->second.substr(2) + "E";
  for (auto it = symbols.statics.lower_bound(prefix); it != symbols.statics.end() && it->first.starts_with(prefix); ++it)
    found.push_back(it->second);
  return found;
}

}  // namespace emu
