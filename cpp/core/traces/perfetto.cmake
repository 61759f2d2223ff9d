# Perfetto / Chrome trace-event export of a stored run (`gpuprof export --format perfetto`).
list(APPEND GPUPROF_TRACES_SOURCES ${CMAKE_CURRENT_LIST_DIR}/perfetto_export.cc)
list(APPEND GPUPROF_TRACES_TESTS ${CMAKE_CURRENT_LIST_DIR}/perfetto_export_test.cc)
