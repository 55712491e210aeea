// The CUDA device runtime as the rest of autosp sees it: which devices exist, which one this rank
// uses, each device's caching allocators and compute streams, copies between host and device, and
// whether the build runs an attention backend. No CUDA header is needed to include this (the
// stream is the driver's opaque CUstream_st*, which is what cudaStream_t names).
//
// A device has one compute stream and one caching allocator per stream slot (device/stream_slot.h):
// slot 0 for ordinary threads, slot r + 1 for thread rank r, so ranks sharing a GPU run on streams
// of their own. compute_stream() and cuda_allocator() answer for the calling thread's slot. Every
// kernel a thread enqueues goes on its slot's stream, so tensors freed to that slot's allocator are
// reused in stream order without events. Anything that works on another stream (the NCCL
// communicator, a peer rank's collective) must order itself after the compute stream and back
// (cudaEventRecord on one, cudaStreamWaitEvent on the other). An out-of-memory in one slot's
// allocator empties every slot's cache on the device and trims the stream-ordered pool (which
// otherwise keeps what is freed into it: its release threshold is raised) before the last retry.
//
// Builds without CUDA have the same functions (src/device/cuda_absent.cpp): cuda_available() is
// false, cuda_device_count() 0, and the others throw UsageError("... this build has no CUDA backend
// (why: configured with AUTOSP_WITH_CUDA=OFF, or nvcc not found)").
#pragma once

#include "device/cuda/caching_allocator.h"
#include "kernels/attention_backend.h"
#include "tensor/tensor.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace autosp {

// A usable CUDA device exists (false in builds without CUDA, or when the driver finds none).
bool cuda_available();
int cuda_device_count();

// The dense bf16 tensor-core peak of `device` in TFLOP/s, from its name (the vendor's datasheet
// figures without sparsity: H100/H200 SXM 989, H100 PCIe 756, A100 312, L40S 362, B200 2250), for
// the trainer's MFU; 0 for a device it does not know (then only runtime.peak_tflops gives MFU).
double dense_bf16_peak_tflops(int device);
// The memory of `device` in bytes (0 in builds without CUDA): what "auto" layout keys plan for.
size_t device_memory_bytes(int device);

// Picks this rank's device from its node-local rank (device/local_rank.h), makes it the current
// device of the process and returns its index. More local ranks than devices: UsageError (exit 2).
int select_device_for_local_rank();

// Make `device` current (cudaSetDevice); the executor calls it before running on that device.
void use_device(int device);

// The caching allocator of `device` in the calling thread's stream slot (created on first use).
CachingAllocator& cuda_allocator(int device);

// The stream the calling thread's kernels on `device` run on: its stream slot's (created on first
// use; never the legacy default stream, so host threads using other streams are not serialised
// behind it). In a slot > 0, the first call for a device orders the slot's stream after the work
// already queued on that device's slot-0 stream.
CUstream_st* compute_stream(int device);

// Waits until the streams of slot `slot` that the calling thread used have finished, and forgets
// them (StreamSlotScope::leave; a no-op in builds without CUDA). An asynchronous kernel failure is
// thrown here as RuntimeFailure.
void drain_stream_slot(int slot);

// A copy of `t` on `to` (host → device, device → host, device → device; contiguous result). A copy
// to the host waits for it (and for all work before it on the compute stream); the others are
// enqueued on the compute stream. A copy to the device `t` is already on still copies.
Tensor to_device(const Tensor& t, Device to);

// dst = src on one CUDA device (src any strides, dst contiguous of the same shape and dtype),
// enqueued on the compute stream: for host code that packs device tensors (gradient buckets).
void copy_on_device(const Tensor& src, const Tensor& dst);

// Wait until all work enqueued on the current device's compute stream has finished; a kernel
// failure that happened asynchronously is thrown here as RuntimeFailure.
void synchronize();

// A UsageError when this build cannot run `backend` (runtime.attention "cudnn" without the CUDA
// backend). The backend itself travels in the executor's options (engine/executor.h ExecOptions).
void check_attention_backend(AttentionBackend backend);

}  // namespace autosp
