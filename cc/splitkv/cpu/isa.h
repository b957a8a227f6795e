// The CPU backend's kernels are compiled once per instruction set (baseline x86-64,
// AVX2+FMA+F16C, and AVX-512) and picked at run time, so what ships runs on any x86-64 yet
// uses wide vectors where the CPU has them. Each build puts its inline code in its own inline namespace, so
// the linker never merges an AVX2 copy of a function into the baseline path.
#ifndef SPLITKV_CPU_ISA_H_
#define SPLITKV_CPU_ISA_H_

#ifndef SPLITKV_CPU_ISA
#define SPLITKV_CPU_ISA baseline
#endif

#endif  // SPLITKV_CPU_ISA_H_
