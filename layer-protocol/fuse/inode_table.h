// The mount's node ids (what the kernel's FUSE calls an inode), one per
// file of the target: a file that is not a directory is keyed by its
// identity in the target (st_dev, st_ino and its type), so every name of a
// hard-linked file is one node, with one set of attributes in the kernel (a
// chmod through one name is the other's at once, and a name removed leaves
// the file reachable by the others). A directory, which has one name, is
// keyed by it: (parent node, name). The root (FUSE_ROOT_ID) is the mounted
// remote directory and never goes.
//
// A node knows its names, each a (parent node, name); its path inside the
// target is its first name's: the parent's path and the name, so renaming
// a directory moves one entry, not its subtree.
//
// Life of a node: lookup() counts each reply that hands it to the kernel;
// forget() takes the kernel's counts back; a node goes once nothing counts
// it and no name has it as parent. A node whose every name was removed
// (unlink, rmdir, a rename onto it, a lookup that found another file
// there) keeps its id until forgotten but has no path any more: path()
// answers nullopt (ENOENT for path operations; open files keep working
// through their handles).
//
// No I/O, no threads: the mount's event loop owns it.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace siphon::fuse {

// What a lookup found at a name: the target's st_dev, st_ino and st_mode
// (only its type counts).
struct FileIdentity {
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint32_t mode = 0;

  bool isDirectory() const { return S_ISDIR(mode); }
};

class InodeTable {
 public:
  static constexpr uint64_t kRootId = 1;  // FUSE_ROOT_ID

  // `root` is the remote directory the root node stands for ("/" or
  // "/var/log"), without a trailing slash except for "/".
  explicit InodeTable(std::string root);

  // The node of the file `name` in `parent` is, `what` (made when new),
  // its lookup count raised by one; 0 when `parent` is unknown. The name
  // becomes one of the node's names; a node it named before (another file
  // was there) loses it.
  uint64_t lookup(uint64_t parent, std::string_view name, const FileIdentity& what);
  // The kernel forgets `count` lookups of `id`.
  void forget(uint64_t id, uint64_t count);
  // The remote path of `id` (by its first name that has one); nullopt for
  // an unknown node or one with no name left.
  std::optional<std::string> path(uint64_t id) const;
  // The remote path of `name` in `parent`; nullopt when `parent` has none.
  std::optional<std::string> childPath(uint64_t parent, std::string_view name) const;

  // `name` in `parent` was removed in the target (unlink, rmdir): its node
  // keeps its other names.
  void removed(uint64_t parent, std::string_view name);
  // `name` in `parent` is now `new_name` in `new_parent`; what was at the
  // new name loses it (replaced). `exchange`: the two swapped (both stay).
  // Two names of one file: nothing changes (rename(2) does nothing).
  void renamed(uint64_t parent, std::string_view name, uint64_t new_parent,
               std::string_view new_name, bool exchange = false);

  // The node of `name` in `parent`, no lookup counted; 0 when none.
  uint64_t find(uint64_t parent, std::string_view name) const;
  bool known(uint64_t id) const { return nodes_.contains(id); }
  // The parent of the node's first name; 0 for the root, an unknown node
  // or one with no name.
  uint64_t parentOf(uint64_t id) const;
  // The node's names, first (the one path() takes) first.
  std::vector<std::pair<uint64_t, std::string>> namesOf(uint64_t id) const;
  // Every node's id.
  std::vector<uint64_t> ids() const;
  // Every (parent, name) the table knows.
  std::vector<std::pair<uint64_t, std::string>> names() const;

  size_t size() const { return nodes_.size(); }
  uint64_t lookups(uint64_t id) const;

 private:
  using Key = std::pair<uint64_t, std::string>;
  using Inode = std::tuple<uint64_t, uint64_t, uint32_t>;  // dev, ino, type
  struct Node {
    std::vector<Key> names;
    uint64_t nlookup = 0;
    uint64_t children = 0;  // names whose parent this node is
    bool directory = false;
    Inode inode{};  // for the others
  };

  // `key` becomes a name of `id` / stops being one; the parents' counts of
  // children follow. Neither erases a node: maybeErase() does after.
  void attach(uint64_t id, Key key);
  void detach(uint64_t id, const Key& key);
  // Erases `id` if nothing holds it any more, then its parents likewise.
  void maybeErase(uint64_t id);

  std::string root_;
  uint64_t next_id_ = kRootId + 1;
  std::unordered_map<uint64_t, Node> nodes_;
  std::map<Key, uint64_t> names_;
  std::map<Inode, uint64_t> inodes_;  // the nodes that are not directories
};

}  // namespace siphon::fuse
