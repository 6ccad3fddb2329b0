# ctest cpp_clang: builds the C++ tests with clang++ as C++17 and C++20
# (-Wall -Wextra -Wpedantic -Wshadow -Werror) against this build's libosftrt
# and runs them. Variables: CLANGXX, SOURCE_DIR, INCLUDE_DIR, DLPACK_DIR,
# LIBRARY, WORK_DIR, TESTS (a list).
file(MAKE_DIRECTORY ${WORK_DIR})
get_filename_component(libdir ${LIBRARY} DIRECTORY)
foreach(std 17 20)
  foreach(t ${TESTS})
    set(exe ${WORK_DIR}/${t}_clang_cxx${std})
    execute_process(
      COMMAND ${CLANGXX} -std=c++${std} -Wall -Wextra -Wpedantic -Wshadow -Werror
              -Wno-missing-field-initializers -I${INCLUDE_DIR} -I${DLPACK_DIR}
              ${SOURCE_DIR}/${t}.cpp ${SOURCE_DIR}/cpp_test_main.cpp ${LIBRARY}
              -Wl,-rpath,${libdir} -o ${exe}
      RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "clang++ -std=c++${std} failed on ${t}.cpp")
    endif()
    execute_process(COMMAND ${exe} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${t} (clang++, C++${std}) failed:\n${out}")
    endif()
    message(STATUS "${t} (clang++, C++${std}): passed")
  endforeach()
endforeach()
