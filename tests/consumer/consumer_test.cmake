# The consumer test: install + find_package(nanoddp) from an outside project.
add_test(NAME consumer-find-package
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run.sh ${PROJECT_BINARY_DIR}
                 ${PROJECT_SOURCE_DIR})
# Judged by the exit code: run.sh fails on any missing or wrong piece (a pass regex would make
# ctest ignore it).
set_tests_properties(consumer-find-package PROPERTIES LABELS "cpu;install" TIMEOUT 300)

# The same for a CPU-only nanoddp on a machine without the CUDA toolkit: its own build of the
# library layers (kept between runs under the build folder, so a rerun is incremental), hidden
# nvcc/CUDA/NCCL, no CUDA library linked. The first run builds the layers: label install-cpu-only
# to pick it out, but it belongs to the normal suite. COST starts it first under ctest -j.
add_test(NAME consumer-cpu-only-without-cuda-toolkit
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run_cpu_only.sh ${PROJECT_BINARY_DIR}
                 ${PROJECT_SOURCE_DIR} ${CMAKE_CXX_COMPILER})
set_tests_properties(consumer-cpu-only-without-cuda-toolkit PROPERTIES
                     LABELS "cpu;install;install-cpu-only" TIMEOUT 1200 COST 1000)
