# ctest example_train_staged: runs osftrt_train with --device cpu and with
# --device staged (the GPU path's uploads and downloads, between separate
# host buffers, on the CPU) and requires the same losses, bit for bit: every
# training step's loss and every evaluation, printed exactly by
# --print-losses. A missed or misplaced copy in the staging logic changes
# them; host code that reads the trainer's device memory outside a library
# call or a copy (a crash on a GPU) faults in staged mode and exits 4.
#
#   cmake -DTRAINER=path/to/osftrt_train "-DARGS=--seed;1;..." -P this file
if(NOT TRAINER)
  message(FATAL_ERROR "TRAINER not set")
endif()
foreach(device cpu staged)
  execute_process(COMMAND "${TRAINER}" ${ARGS} --print-losses --device ${device}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "--device ${device}: exit ${rc}\n${out}\n${err}")
  endif()
  if(NOT out MATCHES "device: ${device} ")
    message(FATAL_ERROR "--device ${device}: no 'device: ${device}' line\n${out}")
  endif()
  string(REGEX MATCHALL "loss-bits [^\n]*" lines_${device} "${out}")
  list(LENGTH lines_${device} n_${device})
  message(STATUS "--device ${device}: ${n_${device}} loss lines")
endforeach()
if(n_cpu LESS 20)
  message(FATAL_ERROR "too few loss lines (${n_cpu})")
endif()
if(NOT n_cpu EQUAL n_staged)
  message(FATAL_ERROR "cpu printed ${n_cpu} loss lines, staged ${n_staged}")
endif()
foreach(i RANGE 1 ${n_cpu})
  math(EXPR j "${i} - 1")
  list(GET lines_cpu ${j} a)
  list(GET lines_staged ${j} b)
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "losses differ: cpu '${a}', staged '${b}'")
  endif()
endforeach()
message(STATUS "cpu and staged: ${n_cpu} identical loss lines")
