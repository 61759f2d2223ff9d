# ctest `build_without_server` (CMakeLists.txt): configures this tree as a machine without the
# team server's libraries would (Boost, zlib and OpenSSL hidden from find_package), expects the
# configure to succeed with a warning that names the Debian packages, then compiles the two
# sources that change without the server (the CLI's main.cc and the extension's bindings).
# -D SOURCE= BUILD= GENERATOR= MAKE_PROGRAM= PYTHON=
file(REMOVE_RECURSE ${BUILD})
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${BUILD} -G ${GENERATOR}
    -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON -DCMAKE_DISABLE_FIND_PACKAGE_ZLIB=ON
    -DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON -DGPUPROF_BUILD_PYTHON=ON
    -DPython_EXECUTABLE=${PYTHON} -DGPUPROF_BUILD_TESTS=OFF
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configure without the server failed (${rc}):\n${out}\n${err}")
endif()
string(REGEX REPLACE "[ \t\r\n]+" " " err "${err}")  # CMake wraps its warnings
foreach(want "Building gpuprof WITHOUT the team server" "Debian: libboost-dev"
             "Debian: zlib1g-dev" "Debian: libssl-dev")
  string(FIND "${err}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the configure warning does not say '${want}':\n${err}")
  endif()
endforeach()
execute_process(
  COMMAND ${CMAKE_COMMAND} --build ${BUILD} --target
    cpp/cli/CMakeFiles/gpuprof_cli.dir/main.cc.o
    cpp/python/CMakeFiles/_native.dir/native_module.cc.o
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "compiling without the server failed:\n${out}\n${err}")
endif()
file(REMOVE_RECURSE ${BUILD})
message(STATUS "without the server: configured with the warning, CLI and bindings compiled")
