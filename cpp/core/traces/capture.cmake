# Trace plan (which steps and windows are traced), the kernel capture through CUPTI, and the
# CPU operators of traced steps from torch.profiler's raw events.
list(APPEND GPUPROF_TRACES_SOURCES ${CMAKE_CURRENT_LIST_DIR}/trace_plan.cc
  ${CMAKE_CURRENT_LIST_DIR}/kernel_capture.cc ${CMAKE_CURRENT_LIST_DIR}/cpu_op_events.cc)
list(APPEND GPUPROF_TRACES_TESTS ${CMAKE_CURRENT_LIST_DIR}/trace_plan_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/kernel_capture_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu_op_events_test.cc)
