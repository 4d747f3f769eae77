# Installs the build tree into a scratch prefix, then configures, builds and runs a
# consumer project that only knows find_package(tp). Run by CTest with -P.
foreach(var TP_BUILD_DIR TP_CONSUMER_SOURCE TP_WORK_DIR TP_PREFIX_PATH TP_GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_install.cmake: ${var} is not set")
  endif()
endforeach()
file(REMOVE_RECURSE "${TP_WORK_DIR}")
set(prefix "${TP_WORK_DIR}/prefix")

function(run step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${step} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${step}: ok\n${out}")
endfunction()

# Torch (and anything else tp was built against) is found through the environment's
# CMAKE_PREFIX_PATH, ':'-separated, as a consumer's shell would set it.
set(ENV{CMAKE_PREFIX_PATH} "${TP_PREFIX_PATH}")
run("install" ${CMAKE_COMMAND} --install "${TP_BUILD_DIR}" --prefix "${prefix}")
run("configure consumer" ${CMAKE_COMMAND} -S "${TP_CONSUMER_SOURCE}" -B "${TP_WORK_DIR}/build" -G "${TP_GENERATOR}"
    "-Dtp_DIR=${prefix}/lib/cmake/tp" -DCMAKE_BUILD_TYPE=Release)
run("build consumer" ${CMAKE_COMMAND} --build "${TP_WORK_DIR}/build")
run("run consumer" "${TP_WORK_DIR}/build/consumer")
