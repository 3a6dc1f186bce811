# Helpers shared by every module's CMakeLists.txt.

# Flags every pipesched target gets: C++20, warnings, compressed debug info, sanitizers.
function(pipesched_target_defaults target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  # -Wno-missing-field-initializers: the code uses C++20 designated initializers that name
  # only the fields they set (`{.kind = kAdamW}`); the others take their default member
  # initializers, which is the point, and GCC 12 would warn for every one.
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers>)
  if(PIPESCHED_COMPRESS_DEBUG)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-gz>)
    # The linker writes uncompressed sections unless told; only programs link.
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "EXECUTABLE")
      target_link_options(${target} PRIVATE -gz)
    endif()
  endif()
  if(PIPESCHED_SANITIZE STREQUAL "address")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
    target_link_options(${target} PUBLIC -fsanitize=address,undefined)
  elseif(PIPESCHED_SANITIZE STREQUAL "thread")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread -fno-omit-frame-pointer>)
    target_link_options(${target} PUBLIC -fsanitize=thread)
  elseif(NOT PIPESCHED_SANITIZE STREQUAL "")
    message(FATAL_ERROR "PIPESCHED_SANITIZE must be '', 'address' or 'thread', not '${PIPESCHED_SANITIZE}'")
  endif()
endfunction()

# pipesched_add_library(<module> SOURCES ... DEPS ...): target pipesched_<module>,
# alias pipesched::<module>, includes rooted at the source tree
# (#include "pipesched/module/x.h").
function(pipesched_add_library module)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  set(target pipesched_${module})
  if(ARG_SOURCES)
    add_library(${target} ${ARG_SOURCES})
    set(scope PUBLIC)
    pipesched_target_defaults(${target})
  else()
    add_library(${target} INTERFACE)
    set(scope INTERFACE)
    target_compile_features(${target} INTERFACE cxx_std_20)
  endif()
  add_library(pipesched::${module} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${module})
  target_include_directories(${target} ${scope}
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
    $<INSTALL_INTERFACE:include>)
  if(ARG_PUBLIC_DEPS)
    target_link_libraries(${target} ${scope} ${ARG_PUBLIC_DEPS})
  endif()
  if(ARG_PRIVATE_DEPS AND ARG_SOURCES)
    target_link_libraries(${target} PRIVATE ${ARG_PRIVATE_DEPS})
  endif()
  set_property(GLOBAL APPEND PROPERTY PIPESCHED_LIBRARIES ${target})
endfunction()

# pipesched_add_test(<name> SOURCES ... DEPS ... [LABELS ...]): one gtest executable.
function(pipesched_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  pipesched_target_defaults(${name})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} pipesched::testing GTest::gtest GTest::gmock
                        GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    PIPESCHED_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    PIPESCHED_SHARED_DIR="${PROJECT_SOURCE_DIR}/../shared")
  set(labels ${ARG_LABELS})
  if(NOT labels)
    set(labels cpu)
  endif()
  # GPU tests get a shorter limit: on the GPU machine a hung one must not eat the whole
  # check's budget (scripts/gpu-check.sh), and none needs more than seconds there.
  set(timeout 300)
  if("gpu" IN_LIST labels)
    set(timeout 90)
  endif()
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS "${labels}" TIMEOUT ${timeout})
endfunction()
