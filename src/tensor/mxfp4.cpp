// MXFP4 dequantization (tensor/mxfp4.h).
#include "tensor/mxfp4.h"

#include <cmath>

#include "tensor/check.h"

namespace autosp {

double fp4_value(uint8_t nibble) {
  static constexpr double kE2M1[16] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};
  return kE2M1[nibble & 0x0F];
}

Tensor mxfp4_dequantize(const ByteTensor& blocks, const ByteTensor& scales, const std::string& blocks_name,
                        const std::string& scales_name, const std::string& where) {
  const Shape& bs = blocks.shape;
  if (bs.size() < 2 || bs.back() != 16)
    throw UsageError(str(where, ": tensor '", blocks_name, "' has shape ", shape_str(bs),
                         ": MXFP4 blocks are [..., blocks, 16] (16 bytes of two FP4 elements per block of 32)"));
  const Shape want(bs.begin(), bs.end() - 1);
  if (scales.shape != want)
    throw UsageError(str(where, ": tensor '", scales_name, "' has shape ", shape_str(scales.shape),
                         ", its blocks '", blocks_name, "' ", shape_str(bs), " need one scale per block ",
                         shape_str(want)));
  Shape out_shape = want;
  out_shape.back() *= 32;
  Tensor out = Tensor::empty(out_shape, DType::f32);
  float* o = out.data<float>();
  const int64_t nblocks = shape_numel(want);
  for (int64_t g = 0; g < nblocks; ++g) {
    const double scale = std::ldexp(1.0, static_cast<int>(scales.data[static_cast<size_t>(g)]) - 127);
    const uint8_t* b = blocks.data.data() + g * 16;
    for (int j = 0; j < 16; ++j) {
      o[g * 32 + 2 * j] = static_cast<float>(fp4_value(b[j] & 0x0F) * scale);
      o[g * 32 + 2 * j + 1] = static_cast<float>(fp4_value(b[j] >> 4) * scale);
    }
  }
  return out;
}

}  // namespace autosp
