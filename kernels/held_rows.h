// Host memory for the rows a call keeps between its passes (a preference
// objective's), reused from one call to the next. A fresh allocation of a
// call's rows (128 MiB at 65535 x 1024 bf16) is mapped anew by the allocator,
// and its first touch pays a page fault and the kernel's zeroing per page, on
// the thread that receives the rows: about as long as the rows take to arrive
// through a fast link. Up to kKeptBuffers buffers wait, already touched, for
// the next call.
#ifndef FLCE_KERNELS_HELD_ROWS_H_
#define FLCE_KERNELS_HELD_ROWS_H_

#include <cstdint>
#include <memory>

namespace flce {

class HeldRows {
 public:
  static constexpr int kKeptBuffers = 2;

  HeldRows() = default;
  // At least `bytes` (one byte for 0): the smallest kept buffer that is large
  // enough, else a new one. Its contents are whatever they were.
  explicit HeldRows(int64_t bytes);
  ~HeldRows();  // the buffer back to the kept ones (the largest kKeptBuffers stay)
  HeldRows(HeldRows&& other) noexcept;
  HeldRows& operator=(HeldRows&& other) noexcept;
  HeldRows(const HeldRows&) = delete;
  HeldRows& operator=(const HeldRows&) = delete;

  char* data() const { return buffer_.get(); }
  int64_t capacity() const { return capacity_; }

  // Bytes kept for the next calls (what the process holds beyond its calls).
  static int64_t KeptBytes();
  // Frees the kept buffers (memory pressure; tests that need a known start).
  static void DropKept();

 private:
  void Release();

  std::unique_ptr<char[]> buffer_;
  int64_t capacity_ = 0;
};

}  // namespace flce

#endif  // FLCE_KERNELS_HELD_ROWS_H_
