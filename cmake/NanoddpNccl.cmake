# NCCL ships no CMake target: find its header and library beside nvcc (or in $NCCL_HOME) and make
# the imported target nanoddp::nccl. Used by the build and by the installed package config, so the
# exported targets name nanoddp::nccl, never this machine's absolute library path.
if(NOT TARGET nanoddp::nccl)
  find_path(NANODDP_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME
            PATH_SUFFIXES include)
  find_library(NANODDP_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME
               PATH_SUFFIXES lib lib64)
  if(NANODDP_NCCL_INCLUDE_DIR AND NANODDP_NCCL_LIBRARY)
    add_library(nanoddp::nccl UNKNOWN IMPORTED)
    set_target_properties(nanoddp::nccl PROPERTIES IMPORTED_LOCATION ${NANODDP_NCCL_LIBRARY}
                          INTERFACE_INCLUDE_DIRECTORIES ${NANODDP_NCCL_INCLUDE_DIR})
  endif()
endif()
