# The consumer test: install + find_package(nanoddp) from an outside project.
add_test(NAME consumer-find-package
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run.sh ${PROJECT_BINARY_DIR}
                 ${PROJECT_SOURCE_DIR})
# Judged by the exit code: run.sh fails on any missing or wrong piece (a pass regex would make
# ctest ignore it).
set_tests_properties(consumer-find-package PROPERTIES LABELS "cpu;install" TIMEOUT 300)
