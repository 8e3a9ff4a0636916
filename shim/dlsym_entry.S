// libdelta.so's exported dlsym, x86-64 (the decisions are delta_dlsymDecide's, in
// interpose.cpp). glibc resolves dlsym(RTLD_NEXT, ...) and dlsym(RTLD_DEFAULT, ...) relative
// to the object its dlsym's return address lies in. A C++ wrapper calling glibc's dlsym would
// make that libdelta.so for every caller, and a library interposing on libc (a sanitizer
// runtime, say) would be handed its own functions back. So this entry asks
// delta_dlsymDecide, keeping the arguments, and then either returns the shim's answer or jumps
// to glibc's dlsym with the caller's return address still on the stack.
//
// delta_dlsymDecide(handle, symbol) returns {answer, next} in rax:rdx: next != 0 means
// "jump to next(handle, symbol)", else answer is dlsym's result.
#if defined(__x86_64__) && defined(__linux__)
  .text
  .globl dlsym
  .type dlsym, @function
  .p2align 4
dlsym:
  .cfi_startproc
#ifdef __CET__
  endbr64
#endif
  pushq %rdi
  .cfi_adjust_cfa_offset 8
  pushq %rsi
  .cfi_adjust_cfa_offset 8
  subq $8, %rsp  // the call below needs rsp 16-byte aligned
  .cfi_adjust_cfa_offset 8
  call delta_dlsymDecide
  addq $8, %rsp
  .cfi_adjust_cfa_offset -8
  popq %rsi
  .cfi_adjust_cfa_offset -8
  popq %rdi
  .cfi_adjust_cfa_offset -8
  testq %rdx, %rdx
  jnz 1f
  ret
1:
  jmp *%rdx  // a tail jump: glibc's dlsym sees our caller's return address
  .cfi_endproc
  .size dlsym, .-dlsym
#endif
  .section .note.GNU-stack, "", @progbits
