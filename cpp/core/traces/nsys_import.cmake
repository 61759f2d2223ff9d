# Nsight Systems import: an `nsys export --type sqlite` file's kernels onto a run's steps.
list(APPEND GPUPROF_TRACES_SOURCES ${CMAKE_CURRENT_LIST_DIR}/nsys_import.cc)
list(APPEND GPUPROF_TRACES_TESTS ${CMAKE_CURRENT_LIST_DIR}/nsys_import_test.cc)
