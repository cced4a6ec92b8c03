/* Calls one exported cachetile kernel (kernel.so, function "main") once, with float32 inputs,
 * after a sweep that evicts them from the caches. Used by bench/cachegrind.py so that
 * valgrind simulates a small C process instead of Python and TVM.
 *
 *   harness KERNEL.so LIBTVM_FFI.so SWEEP_BYTES SHAPE...     (SHAPE: 256x128, one per argument)
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/c_api.h>

typedef int (*Kernel)(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);

/* The kernel allocates its packed buffers through these hooks, which TVM's loader fills in. */
static void* alloc_workspace(int device_type, int device_id, uint64_t nbytes, int code, int bits) {
  return aligned_alloc(64, ((nbytes + 63) / 64) * 64);
}
static int free_workspace(int device_type, int device_id, void* ptr) {
  free(ptr);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: harness KERNEL.so LIBTVM_FFI.so SWEEP_BYTES SHAPE...\n");
    return 2;
  }
  if (!dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL)) {  /* the kernel's error path needs its symbols */
    fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  Kernel kernel = (Kernel)dlsym(lib, "__tvm_ffi_main");
  void** hook = dlsym(lib, "__TVMBackendAllocWorkspace");
  if (hook) *hook = (void*)alloc_workspace;
  hook = dlsym(lib, "__TVMBackendFreeWorkspace");
  if (hook) *hook = (void*)free_workspace;
  int n = argc - 4;
  DLTensor* tensors = calloc(n, sizeof(DLTensor));
  TVMFFIAny* args = calloc(n, sizeof(TVMFFIAny));
  uint32_t seed = 12345;
  for (int i = 0; i < n; ++i) {
    int64_t* shape = calloc(8, sizeof(int64_t));
    int ndim = 0;
    size_t count = 1;
    for (char* part = strtok(argv[4 + i], "x"); part; part = strtok(NULL, "x")) {
      shape[ndim] = atoll(part);
      count *= shape[ndim++];
    }
    float* data = aligned_alloc(64, ((count * 4 + 63) / 64) * 64);
    for (size_t j = 0; j < count; ++j) {
      seed = seed * 1664525u + 1013904223u;
      data[j] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
    tensors[i] = (DLTensor){.data = data, .device = {kDLCPU, 0}, .ndim = ndim,
                            .dtype = {kDLFloat, 32, 1}, .shape = shape, .strides = NULL, .byte_offset = 0};
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].v_ptr = &tensors[i];
  }
  size_t sweep = (size_t)atoll(argv[3]);
  volatile char* evict = malloc(sweep);
  for (size_t j = 0; j < sweep; j += 64) evict[j] = (char)j;
  TVMFFIAny result = {.type_index = kTVMFFINone};
  int rc = kernel(NULL, args, n, &result);
  if (rc != 0) fprintf(stderr, "the kernel failed (%d)\n", rc);
  return rc;
}
