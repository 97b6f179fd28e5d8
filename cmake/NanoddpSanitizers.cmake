# Sanitizer builds (scripts/test-sanitizers.sh).
#
#   -DNANODDP_SANITIZE=address,undefined   AddressSanitizer (+ LeakSanitizer) and UBSan
#   -DNANODDP_SANITIZE=thread              ThreadSanitizer
#   -DNANODDP_SANITIZE=                    none (the default)
#
# The flags are added to the whole directory tree (compile and link), so the library, the apps,
# the benchmarks, the test executables and the test workers they start are all instrumented
# alike; they are not part of the exported nanoddp::nanoddp target, so an installed package
# never forces a sanitizer on its users. UBSan does not recover: the first finding aborts the
# process with a non-zero exit, which the tests see as a failed worker. Only C++ sources are
# instrumented (configure sanitizer builds with -DNANODDP_CUDA=OFF; nvcc takes no -fsanitize).
set(NANODDP_SANITIZE "" CACHE STRING "Sanitizers: address,undefined | thread | empty for none")
set_property(CACHE NANODDP_SANITIZE PROPERTY STRINGS "" "address,undefined" "address" "undefined"
                                                     "thread")

if(NANODDP_SANITIZE)
  string(REPLACE "," ";" _nanoddp_sanitizers "${NANODDP_SANITIZE}")
  foreach(s IN LISTS _nanoddp_sanitizers)
    if(NOT s MATCHES "^(address|undefined|thread|leak)$")
      message(FATAL_ERROR "NANODDP_SANITIZE: unknown sanitizer '${s}' (use address,undefined or "
                          "thread)")
    endif()
  endforeach()
  if("thread" IN_LIST _nanoddp_sanitizers AND "address" IN_LIST _nanoddp_sanitizers)
    message(FATAL_ERROR "NANODDP_SANITIZE: thread and address cannot be combined")
  endif()
  set(_nanoddp_san_flags -fsanitize=${NANODDP_SANITIZE} -fno-omit-frame-pointer)
  if("undefined" IN_LIST _nanoddp_sanitizers)
    list(APPEND _nanoddp_san_flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${_nanoddp_san_flags}>")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC's flow-based warnings are unreliable under the sanitizers (its manual says so): GCC 12
    # warns about <avx512fintrin.h>'s deliberate `__m512 __Y = __Y;` in Eigen's GEMM (GCC bug
    # 105593) and about std::function inside <regex>. The normal build keeps these warnings.
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-uninitialized$<SEMICOLON>-Wno-maybe-uninitialized>)
  endif()
  add_link_options(${_nanoddp_san_flags})
  message(STATUS "nanoddp: sanitizers ${NANODDP_SANITIZE}")
endif()
