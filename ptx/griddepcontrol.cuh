// Programmatic dependent launch (PDL) controls. PTX ISA 7.8, sm_90+
// ("Parallel Synchronization and Communication Instructions: griddepcontrol").
// On older targets they compile to nothing: without the launch attribute (the
// launchers only set it on CC >= 9.0) a grid starts after its predecessor
// completes, which is what `wait` would give.
#pragma once

// Blocks until the prerequisite grids have completed and their memory is visible.
__device__ __forceinline__ void griddepcontrol_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the dependent grid start launching (it still waits in its own `wait`).
__device__ __forceinline__ void griddepcontrol_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
