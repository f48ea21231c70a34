// python/src/locks.h — one lock per bound object that holds mutable state, so that Python threads
// may share objects: calls that only read an object (a forward without a tape, a decoding step's
// weights) run side by side, calls that change it (a step's cache, a backward's gradients) run one
// at a time. Calls on different objects never wait for each other. Not a scheduler: no fairness,
// no queue.
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>
#include <shared_mutex>
#include <utility>

#include "arrays.h"

namespace mhsa::python {

namespace py = pybind11;

// A shared mutex that a bound object carries. Objects are built by value and moved into Python
// once, before any thread can see them: a move gives the new object a fresh, unlocked mutex.
struct ObjectLock {
  std::shared_mutex mutex;
  ObjectLock() = default;
  ObjectLock(ObjectLock&&) noexcept {}
  ObjectLock& operator=(ObjectLock&&) noexcept { return *this; }
};

// How a call uses an object: reading it (shared) or changing it (exclusive).
struct Use {
  ObjectLock* lock;
  bool write;
};
inline Use reading(ObjectLock& l) { return {&l, false}; }
inline Use writing(ObjectLock& l) { return {&l, true}; }

// Holds up to two objects' locks, taken in address order (so two calls that need the same pair
// cannot deadlock); the same object named twice is locked once, exclusively if either use writes.
class Held {
 public:
  template <class... Uses>
  explicit Held(Uses... uses) : uses_{uses...}, n_(sizeof...(Uses)) {
    static_assert(sizeof...(Uses) >= 1 && sizeof...(Uses) <= 2);
    std::sort(uses_.begin(), uses_.begin() + n_,
              [](const Use& a, const Use& b) { return std::less<const ObjectLock*>()(a.lock, b.lock); });
    if (n_ == 2 && uses_[0].lock == uses_[1].lock) {
      uses_[0].write = uses_[0].write || uses_[1].write;
      n_ = 1;
    }
    for (std::size_t i = 0; i < n_; ++i)
      uses_[i].write ? uses_[i].lock->mutex.lock() : uses_[i].lock->mutex.lock_shared();
  }
  ~Held() {
    for (std::size_t i = n_; i-- > 0;)
      uses_[i].write ? uses_[i].lock->mutex.unlock() : uses_[i].lock->mutex.unlock_shared();
  }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;

 private:
  std::array<Use, 2> uses_;
  std::size_t n_;
};

// Runs f() with the GIL released and the objects locked. The GIL goes first: a thread that waits
// for an object then never holds the GIL, which the object's holder needs to return; the locks
// are given back before the GIL is taken again. f must not touch Python objects.
template <class F, class... Uses>
auto locked(F&& f, Uses... uses) {
  GilReleased unlocked;
  const Held held(uses...);
  return std::forward<F>(f)();
}

}  // namespace mhsa::python
