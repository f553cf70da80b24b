// Whether this build is instrumented by ASan or TSan (scripts/sanitize.sh).
// - Their allocators keep freed memory in quarantine and map shadow memory,
//   so a process's RSS says nothing about Siphon's own buffers there: the
//   tests that bound memory check their data as usual but skip the bound.
// - Instrumented code (ASan at -O0) runs several times slower: hang guards
//   and deadlines of whole operations scale by kSanitizerSlowdown.
#pragma once

namespace siphon::fakes {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
#else
inline constexpr bool kSanitizedBuild = false;
#endif

inline constexpr int kSanitizerSlowdown = kSanitizedBuild ? 4 : 1;

}  // namespace siphon::fakes
