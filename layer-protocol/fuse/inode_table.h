// The mount's node ids (what the kernel's FUSE calls an inode): one per name
// the kernel looked up, as (parent node, name), so a node's path inside the
// target is its parent's path and its name, and renaming a directory moves
// one entry, not its subtree. The root (FUSE_ROOT_ID) is the mounted remote
// directory and never goes.
//
// Life of a node: lookup() counts each reply that hands it to the kernel;
// forget() takes the kernel's counts back; a node goes once nothing counts
// it and no child names it as parent. A node whose name was removed
// (unlink, rmdir, or a rename onto it) keeps its id until forgotten but has
// no path any more: path() answers nullopt (ENOENT for path operations;
// open files keep working through their handles).
//
// No I/O, no threads: the mount's event loop owns it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace siphon::fuse {

class InodeTable {
 public:
  static constexpr uint64_t kRootId = 1;  // FUSE_ROOT_ID

  // `root` is the remote directory the root node stands for ("/" or
  // "/var/log"), without a trailing slash except for "/".
  explicit InodeTable(std::string root);

  // The node for `name` in `parent` (made when new), its lookup count
  // raised by one; 0 when `parent` is unknown.
  uint64_t lookup(uint64_t parent, std::string_view name);
  // One more lookup of a known node (a hard link's reply hands the kernel
  // the linked node again); false when `id` is unknown or removed.
  bool ref(uint64_t id);
  // The kernel forgets `count` lookups of `id`.
  void forget(uint64_t id, uint64_t count);
  // The remote path of `id`; nullopt for an unknown or removed node.
  std::optional<std::string> path(uint64_t id) const;
  // The remote path of `name` in `parent`; nullopt when `parent` has none.
  std::optional<std::string> childPath(uint64_t parent, std::string_view name) const;

  // `name` in `parent` was removed in the target (unlink, rmdir).
  void removed(uint64_t parent, std::string_view name);
  // `name` in `parent` is now `new_name` in `new_parent`; what was at the
  // new name is gone (replaced). `exchange`: the two swapped (both stay).
  void renamed(uint64_t parent, std::string_view name, uint64_t new_parent,
               std::string_view new_name, bool exchange = false);

  // The node of `name` in `parent`, no lookup counted; 0 when none.
  uint64_t find(uint64_t parent, std::string_view name) const;
  bool known(uint64_t id) const { return nodes_.contains(id); }
  // The node's parent; 0 for the root, an unknown node or a removed one.
  uint64_t parentOf(uint64_t id) const;
  // Every node's id.
  std::vector<uint64_t> ids() const;
  // Every (parent, name) the table knows.
  std::vector<std::pair<uint64_t, std::string>> names() const;

  size_t size() const { return nodes_.size(); }
  uint64_t lookups(uint64_t id) const;

 private:
  struct Node {
    uint64_t parent = 0;
    std::string name;
    uint64_t nlookup = 0;
    uint64_t children = 0;  // nodes naming this one as parent
    bool linked = true;     // still has its (parent, name)
  };
  using Key = std::pair<uint64_t, std::string>;

  void unlinkNode(uint64_t id);
  void maybeErase(uint64_t id);

  std::string root_;
  uint64_t next_id_ = kRootId + 1;
  std::unordered_map<uint64_t, Node> nodes_;
  std::map<Key, uint64_t> names_;
};

}  // namespace siphon::fuse
