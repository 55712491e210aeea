// MXFP4 (the OCP microscaling format with FP4 E2M1 elements), as gpt-oss's hub checkpoint stores
// its experts and transformers dequantizes them without its kernels (integrations/mxfp4.py,
// convert_moe_packed_tensors):
//   blocks [..., G, 16] u8: each byte holds two elements, the low nibble the even one, the high
//                           nibble the odd one, as indices into the E2M1 table
//                           [+0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6];
//   scales [..., G]     u8: one E8M0 exponent per block of 32 elements, the value 2^(scale - 127);
//   out    [..., G·32]    : element 32·g + j of a row = table[nibble j of block g] · 2^(scale_g - 127).
// Every product is exactly representable in f32 (and in bf16) unless it overflows (a scale of 254
// with an element of magnitude >= 2, or 255): those become ±inf, which the weights loader refuses as
// non-finite. Knows nothing of models: the layout of what the rows mean is the caller's.
#pragma once

#include <string>

#include "tensor/safetensors.h"
#include "tensor/tensor.h"

namespace autosp {

// The E2M1 value of a nibble (0..15).
double fp4_value(uint8_t nibble);

// `blocks` and `scales` as above, dequantized to f32 [..., G·32]. A blocks tensor whose last dim is
// not 16 or of rank < 2, or scales whose shape is not the blocks' less its last dim, is a
// UsageError "<where>: tensor '<name>' ..." naming the tensor at fault.
Tensor mxfp4_dequantize(const ByteTensor& blocks, const ByteTensor& scales, const std::string& blocks_name,
                        const std::string& scales_name, const std::string& where);

}  // namespace autosp
