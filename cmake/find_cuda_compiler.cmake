# Finds nvcc, in this order: $CUDACXX (or -DCMAKE_CUDA_COMPILER), a system
# toolkit (nvcc on PATH, /usr/local/cuda), the CUDA 13 compiler wheels
# (nvidia-cuda-nvcc, nvidia-cuda-runtime, nvidia-cuda-cccl) in this Python.
# Sets JAX_CLUSTER_HAVE_CUDA.
include(CheckLanguage)
set(JAX_CLUSTER_HAVE_CUDA OFF)
if(NOT JAX_CLUSTER_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(_jc_system_nvcc nvcc PATHS /usr/local/cuda/bin)
    if(NOT _jc_system_nvcc)
      execute_process(
        COMMAND "${Python_EXECUTABLE}" -c
          "import nvidia, pathlib; print(next(str(p) for r in nvidia.__path__ for p in pathlib.Path(r).glob('cu1*/bin/nvcc')))"
        OUTPUT_VARIABLE _jc_wheel_nvcc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(_jc_wheel_nvcc)
        message(STATUS "jax_cluster: using nvcc from the CUDA compiler wheels: ${_jc_wheel_nvcc}")
        set(CMAKE_CUDA_COMPILER "${_jc_wheel_nvcc}" CACHE FILEPATH "" FORCE)
        get_filename_component(CUDAToolkit_ROOT "${_jc_wheel_nvcc}/../.." ABSOLUTE)
        # The wheels keep libcudart in lib/, where nvcc's own link looks in lib64/.
        set(CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS} -L${CUDAToolkit_ROOT}/lib")
      endif()
    endif()
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(JAX_CLUSTER_HAVE_CUDA ON)
  elseif(JAX_CLUSTER_CUDA STREQUAL "ON")
    message(FATAL_ERROR "JAX_CLUSTER_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
