#include "fuse/inode_table.h"

#include <algorithm>
#include <utility>

namespace siphon::fuse {

namespace {

// Without its trailing slashes; "/" for an empty one. (push_back, not
// assigning "/": GCC 12 at -O3 warns falsely on that, -Wstringop-overflow.)
std::string normalizedRoot(std::string r) {
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  if (r.empty()) r.push_back('/');
  return r;
}

}  // namespace

InodeTable::InodeTable(std::string root) : root_(normalizedRoot(std::move(root))) {
  Node r;
  r.nlookup = 1;  // the kernel holds the root for the mount's life
  r.directory = true;
  nodes_.emplace(kRootId, std::move(r));
}

void InodeTable::attach(uint64_t id, Key key) {
  ++nodes_.at(key.first).children;
  names_[key] = id;
  nodes_.at(id).names.push_back(std::move(key));
}

void InodeTable::detach(uint64_t id, const Key& key) {
  auto& names = nodes_.at(id).names;
  auto it = std::find(names.begin(), names.end(), key);
  if (it == names.end()) return;
  names.erase(it);
  names_.erase(key);
  --nodes_.at(key.first).children;
}

uint64_t InodeTable::lookup(uint64_t parent, std::string_view name, const FileIdentity& what) {
  if (!nodes_.contains(parent)) return 0;
  Key key{parent, std::string(name)};
  const auto named = names_.find(key);
  const uint64_t was = named == names_.end() ? 0 : named->second;
  const Inode inode{what.dev, what.ino, what.mode & S_IFMT};
  uint64_t id = 0;
  if (what.isDirectory()) {
    // A directory has one name: the node that name had, if a directory.
    if (was != 0 && nodes_.at(was).directory) id = was;
  } else if (auto it = inodes_.find(inode); it != inodes_.end()) {
    id = it->second;  // another name of a file the kernel has
  }
  if (id == 0) {
    id = next_id_++;
    Node n;
    n.directory = what.isDirectory();
    if (!n.directory) {
      n.inode = inode;
      inodes_[inode] = id;
    }
    nodes_.emplace(id, std::move(n));
  }
  ++nodes_.at(id).nlookup;
  if (was == id) return id;
  // The new name first: taking it from the node it had may otherwise
  // erase the parent (no child left).
  if (was != 0) detach(was, key);
  attach(id, std::move(key));
  if (was != 0) maybeErase(was);
  return id;
}

void InodeTable::forget(uint64_t id, uint64_t count) {
  if (id == kRootId) return;
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  it->second.nlookup = count >= it->second.nlookup ? 0 : it->second.nlookup - count;
  maybeErase(id);
}

uint64_t InodeTable::lookups(uint64_t id) const {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? 0 : it->second.nlookup;
}

std::optional<std::string> InodeTable::path(uint64_t id) const {
  if (id == kRootId) return root_;
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return std::nullopt;
  // The first name whose directory still has a path (only a file's names
  // can be in several directories).
  for (const Key& name : it->second.names) {
    auto parent = path(name.first);
    if (!parent) continue;
    if (parent->back() != '/') parent->push_back('/');
    parent->append(name.second);
    return parent;
  }
  return std::nullopt;
}

std::optional<std::string> InodeTable::childPath(uint64_t parent, std::string_view name) const {
  auto p = path(parent);
  if (!p) return std::nullopt;
  if (p->back() != '/') p->push_back('/');
  p->append(name);
  return p;
}

void InodeTable::maybeErase(uint64_t first) {
  std::vector<uint64_t> todo{first};
  while (!todo.empty()) {
    const uint64_t id = todo.back();
    todo.pop_back();
    if (id == kRootId) continue;
    auto it = nodes_.find(id);
    if (it == nodes_.end() || it->second.nlookup != 0 || it->second.children != 0) continue;
    // Its names go with it; their directories may have nothing left then.
    const std::vector<Key> names = std::move(it->second.names);
    for (const Key& k : names) {
      names_.erase(k);
      --nodes_.at(k.first).children;
      todo.push_back(k.first);
    }
    if (!it->second.directory) {
      auto in = inodes_.find(it->second.inode);
      if (in != inodes_.end() && in->second == id) inodes_.erase(in);
    }
    nodes_.erase(it);
  }
}

uint64_t InodeTable::find(uint64_t parent, std::string_view name) const {
  auto it = names_.find(Key{parent, std::string(name)});
  return it == names_.end() ? 0 : it->second;
}

uint64_t InodeTable::parentOf(uint64_t id) const {
  auto it = nodes_.find(id);
  if (id == kRootId || it == nodes_.end() || it->second.names.empty()) return 0;
  return it->second.names.front().first;
}

std::vector<std::pair<uint64_t, std::string>> InodeTable::namesOf(uint64_t id) const {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return {};
  return it->second.names;
}

std::vector<uint64_t> InodeTable::ids() const {
  std::vector<uint64_t> out;
  out.reserve(nodes_.size());
  for (const auto& [id, n] : nodes_) out.push_back(id);
  return out;
}

std::vector<std::pair<uint64_t, std::string>> InodeTable::names() const {
  std::vector<std::pair<uint64_t, std::string>> out;
  out.reserve(names_.size());
  for (const auto& [key, id] : names_) out.push_back(key);
  return out;
}

void InodeTable::removed(uint64_t parent, std::string_view name) {
  const Key key{parent, std::string(name)};
  auto it = names_.find(key);
  if (it == names_.end()) return;
  const uint64_t id = it->second;
  detach(id, key);
  maybeErase(id);
  maybeErase(parent);
}

void InodeTable::renamed(uint64_t parent, std::string_view name, uint64_t new_parent,
                         std::string_view new_name, bool exchange) {
  if (!nodes_.contains(parent) || !nodes_.contains(new_parent)) return;
  Key from{parent, std::string(name)};
  Key to{new_parent, std::string(new_name)};
  if (from == to) return;
  const uint64_t from_id = find(parent, name);
  const uint64_t to_id = find(new_parent, new_name);
  // Two names of one file: rename(2) leaves both as they are.
  if (from_id != 0 && from_id == to_id) return;
  // Every name moves before anything may be erased: a parent that loses
  // a child here may gain one.
  if (to_id != 0) detach(to_id, to);
  if (from_id != 0) detach(from_id, from);
  if (from_id != 0) attach(from_id, to);
  if (exchange && to_id != 0) attach(to_id, from);
  for (const uint64_t id : {to_id, from_id, parent, new_parent}) {
    if (id != 0) maybeErase(id);
  }
}

}  // namespace siphon::fuse
