/* Uses the installed C API from C99 and checks one validation result that
 * needs no GPU: k = 100 is not a multiple of 128. Exit 0 when the library
 * answers M3QKV_ERROR_INVALID_SHAPE with a message naming k. */
#include <stdio.h>
#include <string.h>

#include <m3qkv/m3qkv.h>

int main(void) {
  m3qkv_backend_kind kind = M3QKV_BACKEND_NONE;
  m3qkv_status st = m3qkv_backend(0, &kind);
  if (st == M3QKV_SUCCESS) {
    printf("backend on device 0: %s\n", m3qkv_backend_name(kind));
  } else {
    printf("no backend: %s: %s\n", m3qkv_status_string(st), m3qkv_last_error());
  }

  m3qkv_fused_args a;
  memset(&a, 0, sizeof a);
  a.struct_size = sizeof a;
  a.m = 7;
  a.k = 100;
  a.nq = 16;
  a.nkv = 1;
  st = m3qkv_fused_qkv(&a, 0);
  printf("m3qkv_fused_qkv(k = 100): %s: %s\n", m3qkv_status_string(st), m3qkv_last_error());
  if (st != M3QKV_ERROR_INVALID_SHAPE || strstr(m3qkv_last_error(), "100") == NULL) {
    printf("consumer: FAIL (expected M3QKV_ERROR_INVALID_SHAPE naming the value 100)\n");
    return 1;
  }
  printf("consumer: OK\n");
  return 0;
}
