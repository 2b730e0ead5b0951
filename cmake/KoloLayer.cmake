# kolo_layer(NAME DEPS ... [PRIVATE_DEPS ...]): one static library per layer from every .cc
# file in its folder, installed and exported as kolo::NAME (the export set kolo-targets, see
# KoloInstall.cmake). DEPS are what its public headers need; PRIVATE_DEPS only its sources.
function(kolo_layer name)
  cmake_parse_arguments(L "" "" "DEPS;PRIVATE_DEPS" ${ARGN})
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.cc)
  if(NOT srcs)
    set(srcs ${PROJECT_SOURCE_DIR}/cmake/empty.cc)
  endif()
  add_library(kolo_${name} STATIC ${srcs})
  add_library(kolo::${name} ALIAS kolo_${name})
  # Public headers come from include/ (in the tree) or <prefix>/include (installed); the
  # layers' private headers under src/ are for building kolo only.
  target_include_directories(kolo_${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                                 $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
                                         PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(kolo_${name} PUBLIC ${L_DEPS} PRIVATE ${L_PRIVATE_DEPS})
  target_compile_features(kolo_${name} PUBLIC cxx_std_20)  # the public headers are C++20
  set_target_properties(kolo_${name} PROPERTIES EXPORT_NAME ${name})
  install(TARGETS kolo_${name} EXPORT kolo-targets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()

# kolo_check_layers(LAYER...): fails the configuration when a layer links one that is not
# listed before it, so the link graph keeps the order of docs/architecture.md's map and
# cannot grow a cycle. Both the layers' own link lists and their interface lists count.
function(kolo_check_layers)
  list(JOIN ARGN " < " order)
  set(below "")
  foreach(layer IN LISTS ARGN)
    get_target_property(linked kolo_${layer} LINK_LIBRARIES)
    get_target_property(interface kolo_${layer} INTERFACE_LINK_LIBRARIES)
    foreach(dep IN LISTS linked interface)
      # $<LINK_ONLY:x> is how a static library's private dependency appears in its interface.
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" dep "${dep}")
      if(dep MATCHES "^kolo(::|_)([a-z_]+)$")
        set(other ${CMAKE_MATCH_2})
        if(NOT other IN_LIST below)
          message(FATAL_ERROR "kolo: layer '${layer}' links '${other}', which is not below it; "
                              "a layer may link only layers before it in ${order} "
                              "(docs/architecture.md).")
        endif()
      endif()
    endforeach()
    list(APPEND below ${layer})
  endforeach()
endfunction()

# kolo_test(NAME SOURCES... DEPS ... [LABELS ...] [SLOW REGEX]): one GoogleTest binary, tests
# discovered by CTest. Cases whose names match SLOW (full runs of training, several processes
# for seconds) also get the label `slow`, which the ASan run in scripts/test.sh leaves out.
function(kolo_test name)
  cmake_parse_arguments(T "" "TIMEOUT;SLOW" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(${name} PRIVATE ${T_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE KOLO_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                             KOLO_BINARY_DIR="${PROJECT_BINARY_DIR}")
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
                       PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
  if(T_SLOW)
    # The case names exist only once ctest has run the discovery, so the labelling is a
    # script that ctest includes after the discovered list (${name}_TESTS); ctest scripts
    # can set a test's labels but not append to them.
    set(script ${CMAKE_CURRENT_BINARY_DIR}/${name}_slow.cmake)
    file(WRITE ${script}
         "foreach(t IN LISTS ${name}_TESTS)\n"
         "  if(t MATCHES [==[${T_SLOW}]==])\n"
         "    set_tests_properties(\"\${t}\" PROPERTIES LABELS [==[${T_LABELS};slow]==])\n"
         "  endif()\n"
         "endforeach()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${script})
  endif()
endfunction()
