# Kernels: one instantiation per row of jax_cluster/planning/variants.json,
# generated at configure time into units of JAX_CLUSTER_UNIT_SIZE rows, each
# unit compiled for its own architecture only (SASS, no PTX).
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import jax, os; print(jax.ffi.include_dir())"
  OUTPUT_VARIABLE XLA_FFI_INCLUDE_DIR OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))"
  OUTPUT_VARIABLE CUTLASS_SOURCE_DIR OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
message(STATUS "jax_cluster: XLA FFI headers ${XLA_FFI_INCLUDE_DIR}")
message(STATUS "jax_cluster: CUTLASS headers ${CUTLASS_SOURCE_DIR}/include")

string(REPLACE ";" "," _jc_archs_csv "${JAX_CLUSTER_ARCHS}")
execute_process(
  COMMAND "${Python_EXECUTABLE}" "${CMAKE_SOURCE_DIR}/cc/gen_variants.py"
          "${JAX_CLUSTER_PLANNING_DIR}" "${JAX_CLUSTER_GENERATED_DIR}" "${_jc_archs_csv}"
          "${JAX_CLUSTER_VARIANTS}" "${JAX_CLUSTER_UNIT_SIZE}"
  OUTPUT_VARIABLE _jc_generated OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)

string(REPLACE "\n" ";" _jc_generated "${_jc_generated}")
set(_jc_table "")
set(_jc_units "")
foreach(_line IN LISTS _jc_generated)
  string(REGEX MATCH "^([^|]+)\\|(.+)$" _ "${_line}")
  if(CMAKE_MATCH_1 STREQUAL "table")
    set(_jc_table "${CMAKE_MATCH_2}")
  else()
    list(APPEND _jc_sources_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
    list(APPEND _jc_units "${CMAKE_MATCH_2}")
  endif()
endforeach()
list(LENGTH _jc_units _jc_unit_count)
message(STATUS "jax_cluster: kernel units to compile: ${_jc_unit_count} for ${JAX_CLUSTER_ARCHS} "
               "(JAX_CLUSTER_UNIT_SIZE ${JAX_CLUSTER_UNIT_SIZE}); nvcc takes a minute or more per unit")
# cc/compile_progress.py runs each unit's compile (through any launcher the
# user set, such as ccache) and then says which unit of how many it was: the
# first build is otherwise minutes of silence.
string(REPLACE ";" "\n" _jc_units_text "${_jc_units}")
file(WRITE "${JAX_CLUSTER_GENERATED_DIR}/units.txt" "${_jc_units_text}\n")
set(_jc_launcher "${Python_EXECUTABLE}" "${CMAKE_SOURCE_DIR}/cc/compile_progress.py"
                 "${JAX_CLUSTER_GENERATED_DIR}/units.txt" ${CMAKE_CUDA_COMPILER_LAUNCHER})

set(_jc_cuda_flags -O3 -DNDEBUG --expt-relaxed-constexpr -Xptxas=--warn-on-spills)
# sm90a: CUTLASS's kernels wait (griddepcontrol.wait) before their first
# global access, so a launch may overlap the kernel before it
# (kernels/launch_recording.h), and the cooperative kernel releases its
# dependents after each CTA's last mainloop (kernels/sm90/sm90_stream_k_release.cuh).
# Without a programmatic launch both are no-ops.
set(_jc_arch_flags_sm90a -DCUTLASS_ENABLE_GDC_FOR_SM90)
set(_jc_kernel_libs "")
foreach(_arch IN LISTS JAX_CLUSTER_ARCHS)
  if(NOT _jc_sources_${_arch})
    continue()
  endif()
  string(REGEX REPLACE "^sm([0-9]+[af]?)$" "\\1" _num "${_arch}")
  add_library(kernels_${_arch} OBJECT ${_jc_sources_${_arch}})
  set_target_properties(kernels_${_arch} PROPERTIES CUDA_ARCHITECTURES OFF CUDA_STANDARD 17
                        CUDA_COMPILER_LAUNCHER "${_jc_launcher}")
  target_compile_options(kernels_${_arch} PRIVATE ${_jc_cuda_flags} ${_jc_arch_flags_${_arch}}
                         "-gencode=arch=compute_${_num},code=sm_${_num}")
  target_include_directories(kernels_${_arch} PRIVATE cc "${JAX_CLUSTER_GENERATED_DIR}"
    "${CUTLASS_SOURCE_DIR}/include" "${CUTLASS_SOURCE_DIR}/tools/util/include")
  list(APPEND _jc_kernel_libs kernels_${_arch})
endforeach()

# Kernels outside the menu (no CUTLASS): one object with machine code for every arch.
set(_jc_gencodes "")
foreach(_arch IN LISTS JAX_CLUSTER_ARCHS)
  string(REGEX REPLACE "^sm([0-9]+[af]?)$" "\\1" _num "${_arch}")
  list(APPEND _jc_gencodes "-gencode=arch=compute_${_num},code=sm_${_num}")
endforeach()
add_library(kernels_shared OBJECT cc/kernels/token_tile_quantize.cu
            cc/kernels/weight_block_quantize.cu cc/kernels/fill.cu)
set_target_properties(kernels_shared PROPERTIES CUDA_ARCHITECTURES OFF CUDA_STANDARD 17)
target_compile_options(kernels_shared PRIVATE ${_jc_cuda_flags} ${_jc_gencodes})
target_include_directories(kernels_shared PRIVATE cc "${JAX_CLUSTER_GENERATED_DIR}")
list(APPEND _jc_kernel_libs kernels_shared)

target_sources(_ext PRIVATE ${_jc_table} cc/dispatch/variant_table.cc cc/dispatch/device_slots.cc
               cc/dispatch/gemm_dispatch.cc cc/ffi/dense_call.cc cc/ffi/gemm_ffi.cc
               cc/ffi/gemm_epilogue_ffi.cc cc/ffi/kernel_image.cc cc/ffi/plan_state.cc
               cc/ffi/ragged_ffi.cc cc/ffi/record_stage.cc cc/ffi/scaled_gemm_ffi.cc
               cc/ffi/token_tile_ffi.cc cc/ffi/weight_block_ffi.cc cc/kernels/kept_params.cc
               cc/kernels/launch_recording.cc)
foreach(_lib IN LISTS _jc_kernel_libs)
  target_sources(_ext PRIVATE $<TARGET_OBJECTS:${_lib}>)
endforeach()
target_include_directories(_ext PRIVATE "${XLA_FFI_INCLUDE_DIR}" ${CMAKE_CUDA_TOOLKIT_INCLUDE_DIRECTORIES})
target_link_libraries(_ext PRIVATE "${JAX_CLUSTER_CUDART_STATIC}" Threads::Threads ${CMAKE_DL_LIBS} rt)
set_target_properties(_ext PROPERTIES CUDA_ARCHITECTURES OFF)
target_compile_definitions(_ext PRIVATE JAX_CLUSTER_WITH_CUDA=1
  JAX_CLUSTER_ARCHS="${_jc_archs_csv}" JAX_CLUSTER_CUDA_COMPILER="${CMAKE_CUDA_COMPILER} ${CMAKE_CUDA_COMPILER_VERSION}")
