# `cmake --install`: the layers' static libraries, the public headers, the `kolo` program, and
# the package files a user's build finds them by: kolo-config.cmake (find_package(kolo),
# target kolo::kolo) and kolo.pc (pkg-config). Included by the top CMakeLists.txt.
include(CMakePackageConfigHelpers)

set(KOLO_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/kolo)

install(DIRECTORY include/kolo DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS kolo RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS kolo_all EXPORT kolo-targets)
install(EXPORT kolo-targets NAMESPACE kolo:: FILE kolo-targets.cmake
        DESTINATION ${KOLO_INSTALL_CMAKEDIR})

configure_package_config_file(cmake/kolo-config.cmake.in
                              ${PROJECT_BINARY_DIR}/kolo-config.cmake
                              INSTALL_DESTINATION ${KOLO_INSTALL_CMAKEDIR})
# 0.x: a minor release may change the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kolo-config-version.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kolo-config.cmake ${PROJECT_BINARY_DIR}/kolo-config-version.cmake
        DESTINATION ${KOLO_INSTALL_CMAKEDIR})

# kolo.pc: the layers in link order, each before the layers it uses; tensor and autograd refer
# to each other, so they form a linker group (pkg-config drops repeated -l flags, so the pair
# cannot simply come twice as CMake links it). Then the pkg-config modules of their dependencies.
set(KOLO_PC_LIBS "")
foreach(layer IN ITEMS report train launch parallel comm checkpoint optim nn data observe)
  string(APPEND KOLO_PC_LIBS " -lkolo_${layer}")
endforeach()
string(APPEND KOLO_PC_LIBS " -Wl,--start-group -lkolo_tensor -lkolo_autograd -Wl,--end-group -lkolo_base")
# The base layer's own libraries: libdw names the flight recorder's stack frames (when found).
if(KOLO_LIBDW_INCLUDE AND KOLO_LIBDW)
  string(APPEND KOLO_PC_LIBS " -ldw")
endif()
string(APPEND KOLO_PC_LIBS " -ldl")
set(KOLO_PC_REQUIRES "openblas zlib libpng libjpeg nlohmann_json libsodium")
set(KOLO_PC_CFLAGS "")
if(KOLO_WITH_MPI)
  string(APPEND KOLO_PC_REQUIRES " ompi-c")
  set(KOLO_PC_CFLAGS " -DKOLO_HAVE_MPI=1")
endif()
# The prefix is found from the .pc file's own place, so `cmake --install --prefix` anywhere works.
file(RELATIVE_PATH KOLO_PC_PREFIX /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
string(REGEX REPLACE "/$" "" KOLO_PC_PREFIX "${KOLO_PC_PREFIX}")
configure_file(cmake/kolo.pc.in ${PROJECT_BINARY_DIR}/kolo.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kolo.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
