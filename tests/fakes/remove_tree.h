// Removes a directory tree however deep, with no path longer than a name
// (a tree made to exceed PATH_MAX cannot be removed by whole paths).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace siphon::fakes {

// Removes `name` in the directory `dirfd` and everything below it.
inline void removeTree(int dirfd, const std::string& name) {
  const int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    (void)::unlinkat(dirfd, name.c_str(), 0);
    return;
  }
  DIR* d = ::fdopendir(fd);
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      names.emplace_back(e->d_name);
    }
  }
  for (const std::string& n : names) removeTree(::dirfd(d), n);
  ::closedir(d);
  (void)::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR);
}

}  // namespace siphon::fakes
