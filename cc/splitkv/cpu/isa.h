// The CPU backend's kernels are compiled once per instruction set (baseline x86-64,
// AVX2+FMA+F16C, and AVX-512) and picked at run time, so what ships runs on any x86-64 yet
// uses wide vectors where the CPU has them. Each build puts its inline code in its own inline namespace, so
// the linker never merges an AVX2 copy of a function into the baseline path.
#ifndef SPLITKV_CPU_ISA_H_
#define SPLITKV_CPU_ISA_H_

#ifndef SPLITKV_CPU_ISA
#define SPLITKV_CPU_ISA baseline
#endif

#include <cstddef>
#include <new>
#include <vector>

namespace splitkv::cpu {
inline namespace SPLITKV_CPU_ISA {

// The kernels' buffers are Vector<T>, never std::vector<T>: std::vector<T>'s out-of-line
// members (assign, resize, ...) are weak symbols, and each build emits them compiled for its
// own ISA; the linker keeps one copy for all three, so AVX2 code could call the AVX-512
// build's copy (an illegal instruction on an AMD EPYC without AVX-512, in the static
// library). A vector of this build's own allocator is another type, with its own symbols.
template <typename T>
struct IsaAllocator {
  using value_type = T;
  IsaAllocator() noexcept = default;
  template <typename U>
  IsaAllocator(const IsaAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T))); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p); }
};

template <typename T, typename U>
bool operator==(const IsaAllocator<T>&, const IsaAllocator<U>&) noexcept {
  return true;
}

template <typename T, typename U>
bool operator!=(const IsaAllocator<T>&, const IsaAllocator<U>&) noexcept {
  return false;
}

template <typename T>
using Vector = std::vector<T, IsaAllocator<T>>;

}  // namespace SPLITKV_CPU_ISA
}  // namespace splitkv::cpu

#endif  // SPLITKV_CPU_ISA_H_
