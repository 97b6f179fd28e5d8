# The consumer test: install + find_package(nanoddp) from an outside project.
add_test(NAME consumer-find-package
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/consumer/run.sh ${PROJECT_BINARY_DIR}
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(consumer-find-package PROPERTIES LABELS "cpu;install" TIMEOUT 300
                     PASS_REGULAR_EXPRESSION "consumer: loss")
