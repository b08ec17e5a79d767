// A bounded map that forgets its least recently used entry: the cuBLASLt plan cache (gemm.hpp), where a
// mixture of experts makes a new product shape for nearly every expert of every step (row counts and
// alignments change). Plain C++, tested without a GPU. Not thread-safe: the caller locks.
#pragma once
#include <cstddef>
#include <list>
#include <map>
#include <stdexcept>
#include <utility>

namespace mt::cuda {

template <class Key, class Value>
class LruCache {
 public:
  explicit LruCache(std::size_t capacity) : capacity_(capacity) {
    if (capacity == 0) throw std::invalid_argument("LruCache: capacity must be > 0");
  }
  // The entry for key, now the most recently used; null when absent.
  Value* find(const Key& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    entries_.splice(entries_.begin(), entries_, it->second);
    return &it->second->second;
  }
  // Adds (key, value) as the most recently used entry (key absent), dropping the least recently used
  // one beyond the capacity (its Value's destructor releases what it holds).
  Value& insert(const Key& key, Value value) {
    entries_.emplace_front(key, std::move(value));
    index_.emplace(key, entries_.begin());
    if (entries_.size() > capacity_) {
      index_.erase(entries_.back().first);
      entries_.pop_back();
      ++evictions_;
    }
    return entries_.front().second;
  }
  void clear() {
    index_.clear();
    entries_.clear();
  }
  std::size_t size() const { return entries_.size(); }
  std::size_t capacity() const { return capacity_; }
  std::size_t evictions() const { return evictions_; }
  template <class F>
  void for_each(F f) const {
    for (const auto& kv : entries_) f(kv.first, kv.second);
  }

 private:
  using Entries = std::list<std::pair<Key, Value>>;
  std::size_t capacity_;
  Entries entries_;  // most recently used first
  std::map<Key, typename Entries::iterator> index_;
  std::size_t evictions_ = 0;
};

}  // namespace mt::cuda
