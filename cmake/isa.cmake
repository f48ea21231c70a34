# mhsa_add_isa_sources(target src...): compiles each kernel source once per ISA. For every source
# and ISA a one-line wrapper in the build tree defines MHSA_ISA (the namespace) and includes the
# source, and gets that ISA's flags. On non-x86 machines only the portable variant is built.
set(MHSA_ISA_FLAGS_portable "-ffp-contract=fast")
set(MHSA_ISA_FLAGS_avx2 "-mavx2;-mfma;-mf16c;-ffp-contract=fast")
set(MHSA_ISA_FLAGS_avx512 "-mavx512f;-mavx512vl;-mavx512bw;-mavx512dq;-mavx2;-mfma;-mf16c;-ffp-contract=fast")
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
  set(MHSA_ISAS portable avx2 avx512)
else()
  set(MHSA_ISAS portable)
endif()

function(mhsa_add_isa_sources target)
  foreach(src IN LISTS ARGN)
    get_filename_component(abs "${src}" ABSOLUTE)
    get_filename_component(name "${src}" NAME_WE)
    foreach(isa IN LISTS MHSA_ISAS)
      set(wrapper "${CMAKE_BINARY_DIR}/isa/${name}_${isa}.cpp")
      file(CONFIGURE OUTPUT "${wrapper}" CONTENT "#define MHSA_ISA ${isa}\n#include \"${abs}\"\n")
      target_sources(${target} PRIVATE "${wrapper}")
      set_source_files_properties("${wrapper}" PROPERTIES COMPILE_OPTIONS "${MHSA_ISA_FLAGS_${isa}}")
    endforeach()
  endforeach()
  if("avx512" IN_LIST MHSA_ISAS)
    target_compile_definitions(${target} PRIVATE MHSA_HAVE_X86_KERNELS=1)
  endif()
endfunction()

# mhsa_add_isa_variant(target src name flags): one more build of a kernel source, in namespace
# mhsa::kernels::<name> with these flags (an ISA extension that only some of an ISA's CPUs have;
# the dispatcher picks it where the CPU has it).
function(mhsa_add_isa_variant target src name flags)
  get_filename_component(abs "${src}" ABSOLUTE)
  get_filename_component(base "${src}" NAME_WE)
  set(wrapper "${CMAKE_BINARY_DIR}/isa/${base}_${name}.cpp")
  file(CONFIGURE OUTPUT "${wrapper}" CONTENT "#define MHSA_ISA ${name}\n#include \"${abs}\"\n")
  target_sources(${target} PRIVATE "${wrapper}")
  set_source_files_properties("${wrapper}" PROPERTIES COMPILE_OPTIONS "${flags}")
endfunction()
