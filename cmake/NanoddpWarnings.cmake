# Warnings are errors in nanoddp's own code (NANODDP_WERROR=OFF to relax a local build).
function(nanoddp_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
      -Wno-missing-field-initializers>)
  if(NANODDP_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

# Flags for nanoddp's own executables (apps, benchmarks, tests): the same -march as the library,
# so that templates instantiated on both sides (Eigen's, in the GEMM benchmark) agree; a mixed
# build lets the linker keep whichever copy it sees first.
function(nanoddp_executable target)
  nanoddp_set_warnings(${target})
  if(NANODDP_NATIVE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
  endif()
endfunction()
