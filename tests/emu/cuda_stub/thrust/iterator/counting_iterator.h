#pragma once
// Stub of thrust/iterator/counting_iterator.h for the CPU emulation (tests/emu/README.md): the random-access
// sequence value, value + 1, ... that kv_topk.cuh feeds to cub::DeviceSelect::If.
#include <cstdint>

namespace thrust {

template <class Incrementable>
class counting_iterator {
 public:
  using value_type = Incrementable;
  using difference_type = std::int64_t;
  explicit counting_iterator(Incrementable first) : first_(first) {}
  Incrementable operator[](difference_type i) const { return static_cast<Incrementable>(first_ + i); }
  Incrementable operator*() const { return first_; }
  counting_iterator operator+(difference_type i) const {
    return counting_iterator(static_cast<Incrementable>(first_ + i));
  }

 private:
  Incrementable first_;
};

}  // namespace thrust
