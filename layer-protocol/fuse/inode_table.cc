#include "fuse/inode_table.h"

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
  nodes_.emplace(kRootId, std::move(r));
}

uint64_t InodeTable::lookup(uint64_t parent, std::string_view name) {
  auto p = nodes_.find(parent);
  if (p == nodes_.end()) return 0;
  Key key{parent, std::string(name)};
  if (auto it = names_.find(key); it != names_.end()) {
    ++nodes_[it->second].nlookup;
    return it->second;
  }
  const uint64_t id = next_id_++;
  Node n;
  n.parent = parent;
  n.name = std::string(name);
  n.nlookup = 1;
  ++p->second.children;
  nodes_.emplace(id, std::move(n));
  names_.emplace(std::move(key), id);
  return id;
}

bool InodeTable::ref(uint64_t id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end() || !it->second.linked) return false;
  ++it->second.nlookup;
  return true;
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
  if (it == nodes_.end() || !it->second.linked) return std::nullopt;
  auto parent = path(it->second.parent);
  if (!parent) return std::nullopt;
  if (parent->back() != '/') parent->push_back('/');
  parent->append(it->second.name);
  return parent;
}

std::optional<std::string> InodeTable::childPath(uint64_t parent, std::string_view name) const {
  auto p = path(parent);
  if (!p) return std::nullopt;
  if (p->back() != '/') p->push_back('/');
  p->append(name);
  return p;
}

void InodeTable::unlinkNode(uint64_t id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end() || !it->second.linked) return;
  names_.erase(Key{it->second.parent, it->second.name});
  it->second.linked = false;
  maybeErase(id);
}

void InodeTable::maybeErase(uint64_t id) {
  while (id != kRootId) {
    auto it = nodes_.find(id);
    if (it == nodes_.end()) return;
    Node& n = it->second;
    if (n.nlookup != 0 || n.children != 0) return;
    if (n.linked) names_.erase(Key{n.parent, n.name});
    const uint64_t parent = n.parent;
    nodes_.erase(it);
    auto p = nodes_.find(parent);
    if (p == nodes_.end()) return;
    --p->second.children;
    id = parent;
  }
}

uint64_t InodeTable::find(uint64_t parent, std::string_view name) const {
  auto it = names_.find(Key{parent, std::string(name)});
  return it == names_.end() ? 0 : it->second;
}

uint64_t InodeTable::parentOf(uint64_t id) const {
  auto it = nodes_.find(id);
  if (id == kRootId || it == nodes_.end() || !it->second.linked) return 0;
  return it->second.parent;
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
  auto it = names_.find(Key{parent, std::string(name)});
  if (it != names_.end()) unlinkNode(it->second);
}

void InodeTable::renamed(uint64_t parent, std::string_view name, uint64_t new_parent,
                         std::string_view new_name, bool exchange) {
  if (!nodes_.contains(parent) || !nodes_.contains(new_parent)) return;
  auto from = names_.find(Key{parent, std::string(name)});
  auto to = names_.find(Key{new_parent, std::string(new_name)});
  const uint64_t from_id = from == names_.end() ? 0 : from->second;
  const uint64_t to_id = to == names_.end() ? 0 : to->second;
  if (from_id != 0 && from_id == to_id) return;  // the same name
  if (exchange) {
    // Both names stay; the nodes swap them.
    if (from != names_.end()) names_.erase(from);
    if (to != names_.end()) names_.erase(to);
    auto place = [&](uint64_t id, uint64_t p, std::string_view n) {
      if (id == 0) return;
      Node& node = nodes_[id];
      if (node.parent != p) {
        --nodes_[node.parent].children;
        ++nodes_[p].children;
        node.parent = p;
      }
      node.name = std::string(n);
      names_[Key{p, node.name}] = id;
    };
    place(from_id, new_parent, new_name);
    place(to_id, parent, name);
    return;
  }
  if (to_id != 0) unlinkNode(to_id);
  if (from_id == 0) return;
  names_.erase(Key{parent, std::string(name)});
  Node& node = nodes_[from_id];
  if (node.parent != new_parent) {
    // The new parent first: dropping the old one's count may erase it.
    ++nodes_[new_parent].children;
    const uint64_t old_parent = node.parent;
    node.parent = new_parent;
    node.name = std::string(new_name);
    names_[Key{new_parent, node.name}] = from_id;
    --nodes_[old_parent].children;
    maybeErase(old_parent);
    return;
  }
  node.name = std::string(new_name);
  names_[Key{new_parent, node.name}] = from_id;
}

}  // namespace siphon::fuse
