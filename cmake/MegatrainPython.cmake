# The Python module megatrain._engine (python/) is built when pybind11 and the Python development
# headers are found (AUTO) or demanded (ON). Its static libraries are linked into a shared object, so
# the whole project is then compiled position-independent. (MEGATRAIN_PYTHON names the test oracle's
# interpreter, hence the _MODULE suffix.)
set(MEGATRAIN_HAVE_PYTHON_MODULE OFF)
if(NOT MEGATRAIN_PYTHON_MODULE STREQUAL "OFF")
  find_package(Python 3.8 COMPONENTS Interpreter Development.Module)
  if(Python_FOUND)
    set(PYBIND11_FINDPYTHON ON)
    find_package(pybind11 2.10 CONFIG QUIET)
  endif()
  if(Python_FOUND AND pybind11_FOUND)
    set(MEGATRAIN_HAVE_PYTHON_MODULE ON)
    set(CMAKE_POSITION_INDEPENDENT_CODE ON)
    message(STATUS "megatrain: Python module ON (Python ${Python_VERSION}, pybind11 ${pybind11_VERSION})")
  elseif(MEGATRAIN_PYTHON_MODULE STREQUAL "ON")
    message(FATAL_ERROR "MEGATRAIN_PYTHON_MODULE=ON but the Python development headers or pybind11 were not found "
                        "(Debian: python3-dev pybind11-dev)")
  else()
    message(STATUS "megatrain: Python module OFF (no Python development headers or pybind11 found)")
  endif()
endif()
