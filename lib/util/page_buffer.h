// PageBuffer<T>: a zero-filled array whose pages take resident memory only once written. For
// buffers sized for the largest case and mostly used far below it: a session's logit rows for its
// longest draft, or the drafter-probability rows that greedy sessions and point-mass drafters
// never write. Anonymous memory from mmap, so untouched pages cost nothing whatever the
// allocator's state.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <type_traits>
#include <utility>

#include "../../common/fault_point.h"
#include "util/error.h"

namespace specinfer {

template <typename T>
class PageBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "PageBuffer holds plain values");

 public:
  PageBuffer() = default;
  PageBuffer(const PageBuffer &) = delete;
  PageBuffer &operator=(const PageBuffer &) = delete;
  PageBuffer(PageBuffer &&o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  PageBuffer &operator=(PageBuffer &&o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~PageBuffer() { release(); }

  // Replaces the contents with n zeros. Throws Error(OUT_OF_MEMORY) when the memory is refused.
  void assign_zero(size_t n) {
    release();
    if (n == 0) return;
    if (n > static_cast<size_t>(-1) / sizeof(T))
      fail(SPECINFER_ERR_OUT_OF_MEMORY, "cannot allocate %zu values of %zu bytes", n, sizeof(T));
    void *p = fault_injected(FAULT_ALLOC) ? MAP_FAILED
                                          : mmap(nullptr, n * sizeof(T), PROT_READ | PROT_WRITE,
                                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      fail(SPECINFER_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes", n * sizeof(T));
    p_ = static_cast<T *>(p);
    n_ = n;
  }

  T *data() { return p_; }
  const T *data() const { return p_; }
  size_t size() const { return n_; }
  T &operator[](size_t i) { return p_[i]; }
  const T &operator[](size_t i) const { return p_[i]; }

 private:
  void release() {
    if (p_) munmap(p_, n_ * sizeof(T));
    p_ = nullptr;
    n_ = 0;
  }
  T *p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace specinfer
