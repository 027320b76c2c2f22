// Anonymous memory reserved up front and made resident only where it is written: a sequence's KV
// cache reserves room for the whole context without holding it, so its resident size follows the
// positions it has used, and it never moves (no copy when the context grows).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "../../common/fault_point.h"
#include "gguf_error.h"

namespace specinfer::gguf {

class PageArray {
 public:
  PageArray() = default;
  // Reserves `bytes` (zero-filled on first touch). Throws OUT_OF_MEMORY when the mapping fails.
  explicit PageArray(size_t bytes) : size_(bytes) {
    if (bytes == 0) return;
    void *p = fault_injected(FAULT_ALLOC)
                  ? MAP_FAILED
                  : mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail(SPECINFER_ERR_OUT_OF_MEMORY, "gguf: cannot reserve %zu bytes", bytes);
    data_ = static_cast<uint8_t *>(p);
  }
  ~PageArray() {
    if (data_) munmap(data_, size_);
  }
  PageArray(PageArray &&o) noexcept { swap(o); }
  PageArray &operator=(PageArray &&o) noexcept {
    PageArray t(std::move(o));
    swap(t);
    return *this;
  }
  PageArray(const PageArray &) = delete;
  PageArray &operator=(const PageArray &) = delete;

  uint8_t *data() const { return data_; }
  size_t size() const { return size_; }

  // Hands the whole pages inside [begin, end) back to the system; they read as zeros afterwards.
  void release(size_t begin, size_t end) {
    const size_t page = page_size();
    begin = (begin + page - 1) / page * page;
    end = std::min(end, size_) / page * page;
    if (data_ && begin < end) madvise(data_ + begin, end - begin, MADV_DONTNEED);
  }

  // Bytes of it resident now (mincore).
  size_t resident() const {
    const size_t page = page_size(), n = (size_ + page - 1) / page;
    if (!data_ || n == 0) return 0;
    std::vector<unsigned char> in(n);
    if (mincore(data_, size_, in.data()) != 0) return 0;
    size_t pages = 0;
    for (unsigned char b : in) pages += b & 1;
    return pages * page;
  }

  static size_t page_size() {
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return page;
  }

 private:
  void swap(PageArray &o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }
  uint8_t *data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace specinfer::gguf
