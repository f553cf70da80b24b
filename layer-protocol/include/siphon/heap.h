// Bulk buffers kept in the heap between uses.
//
// A file read moves a MiB per answer through fresh std::strings (protobuf
// parses, the file helper's reads). glibc's defaults give each freed MiB
// back to the kernel (a chunk above the dynamic mmap threshold is unmapped,
// a free top above twice it is trimmed), so the next MiB faults its pages in
// and the kernel clears them again: measured, a quarter of the file helper's
// time and more on a VM whose host backs a page only when it is first
// touched. keepBulkBuffers() keeps them: allocations up to 32 MiB from the
// heap, and a free top trimmed only past 16 MiB. The cost is that much
// memory held after a burst of reads, so only processes that move bulk
// bytes and are not the long-lived agent call it: the file helper and the
// CLI. The agent keeps its few bulk buffers itself (fs_helper.cc).
#pragma once

#include <malloc.h>

namespace siphon {

inline void keepBulkBuffers() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 16 << 20);
}

}  // namespace siphon
