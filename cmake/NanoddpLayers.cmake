# One static library per layer, kernels -> engine -> nn -> comm, each with an explicit source list
# in its own folder's CMakeLists.txt. Sources include headers as "nanoddp/<layer>/x.h"; a layer
# sees only its own headers and those of the layers below it, because its include root is a
# folder in the build tree that holds one symlink, nanoddp/<layer> -> <source>/<layer>, and it
# inherits only its dependencies' roots. So a layer that includes one above it does not build
# ("nanoddp/comm/x.h: No such file or directory"); tests/layering proves it.
#
# Installed, each layer's public headers go to include/nanoddp/<layer>/ (its INTERNAL headers
# stay behind), so consumers write the same #include lines; <nanoddp/nanoddp.h> includes them all
# (cmake/NanoddpUmbrella.cmake).

# nanoddp_layer(NAME SOURCES a.cpp ... [CUDA_SOURCES ...] [NOCUDA_SOURCES ...] [INTERNAL x.h ...]
#               [DEPS layer ...])
function(nanoddp_layer name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;CUDA_SOURCES;NOCUDA_SOURCES;INTERNAL;DEPS")
  set(sources ${arg_SOURCES})
  if(NANODDP_WITH_CUDA)
    list(APPEND sources ${arg_CUDA_SOURCES})
  else()
    list(APPEND sources ${arg_NOCUDA_SOURCES})
  endif()
  # Every source file of the folder must be in one of the lists: a file someone forgot to list
  # fails here, by name, instead of as an undefined reference at link time.
  file(GLOB_RECURSE present RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} CONFIGURE_DEPENDS
       ${CMAKE_CURRENT_SOURCE_DIR}/*.cpp ${CMAKE_CURRENT_SOURCE_DIR}/*.cu)
  list(REMOVE_ITEM present ${arg_SOURCES} ${arg_CUDA_SOURCES} ${arg_NOCUDA_SOURCES})
  if(present)
    message(FATAL_ERROR "${name}/CMakeLists.txt does not list: ${present}")
  endif()
  set(target nanoddp_${name})
  add_library(${target} STATIC ${sources})
  add_library(nanoddp::${target} ALIAS ${target})

  set(root ${PROJECT_BINARY_DIR}/include/${name})
  file(MAKE_DIRECTORY ${root}/nanoddp)
  file(CREATE_LINK ${CMAKE_CURRENT_SOURCE_DIR} ${root}/nanoddp/${name} SYMBOLIC)
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${root}>
                                              $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  foreach(dep IN LISTS arg_DEPS)
    target_link_libraries(${target} PUBLIC nanoddp_${dep})
  endforeach()
  target_compile_features(${target} PUBLIC cxx_std_20)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON
                                             CUDA_SEPARABLE_COMPILATION OFF)
  nanoddp_set_warnings(${target})
  if(NANODDP_NATIVE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
  endif()
  # Nothing in nanoddp reads errno after a math call; without this flag GCC keeps a scalar errno
  # path in every sqrt, which blocks vectorizing loops such as AdamW's (4x slower).
  target_compile_options(${target} PRIVATE
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:Release>>:-O3> $<$<COMPILE_LANGUAGE:CXX>:-fno-math-errno>)
  if(NANODDP_WITH_CUDA)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:-O3 --expt-relaxed-constexpr -Xcompiler=-Wall,-Wextra>)
    if(NANODDP_WERROR)
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
    endif()
  endif()

  # The public headers: every header of the layer but its INTERNAL files and folders.
  file(GLOB_RECURSE headers RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} CONFIGURE_DEPENDS
       ${CMAKE_CURRENT_SOURCE_DIR}/*.h)
  foreach(header IN LISTS headers)
    set(internal FALSE)
    foreach(entry IN LISTS arg_INTERNAL)
      if(header STREQUAL entry OR header MATCHES "^${entry}/")
        set(internal TRUE)
      endif()
    endforeach()
    if(NOT internal)
      get_filename_component(subdir ${header} DIRECTORY)
      install(FILES ${header} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/nanoddp/${name}/${subdir})
      set_property(GLOBAL APPEND PROPERTY NANODDP_PUBLIC_HEADERS nanoddp/${name}/${header})
    endif()
  endforeach()
  install(TARGETS ${target} EXPORT nanoddpTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()
