# bpf_object(NAME SOURCE): builds a BPF C program into a libbpf skeleton.
#
#   SOURCE --clang -O2 -g -target bpf--> NAME.bpf.o --bpftool gen skeleton--> NAME.skel.h
#
# and makes an INTERFACE library NAME_skel whose (SYSTEM) include directory
# holds NAME.skel.h and which links libbpf. The skeleton embeds the object's
# bytes, so the binary needs no .o file at run time. The skeleton's struct and
# functions are named NAME_bpf (struct NAME_bpf, NAME_bpf__open(), ...).
#
# vmlinux.h is generated once per build directory from the build machine's
# kernel BTF (/sys/kernel/btf/vmlinux), or taken from BPF_VMLINUX_H if set
# (a committed header, for build machines without BTF). It is a build input
# only; CO-RE relocates against the running kernel's BTF at load time.
#
# This file doubles as a `cmake -P` script (BPF_STEP=...) so the build steps
# need no shell: outputs are written to a temporary file and renamed, so a
# failed step never leaves a truncated header that looks up to date.

if(CMAKE_SCRIPT_MODE_FILE)
  # --- script mode: one build step --------------------------------------------
  if(BPF_STEP STREQUAL "vmlinux")
    # bpftool btf dump file <btf> format c > vmlinux.h
    execute_process(
      COMMAND ${BPFTOOL} btf dump file ${BTF} format c
      OUTPUT_FILE ${OUT}.tmp
      RESULT_VARIABLE rc)
  elseif(BPF_STEP STREQUAL "skeleton")
    # bpftool gen skeleton NAME.bpf.o name NAME_bpf > NAME.skel.h
    execute_process(
      COMMAND ${BPFTOOL} gen skeleton ${OBJ} name ${SKEL_NAME}
      OUTPUT_FILE ${OUT}.tmp
      RESULT_VARIABLE rc)
  else()
    message(FATAL_ERROR "BpfObject.cmake: unknown BPF_STEP '${BPF_STEP}'")
  endif()
  if(NOT rc EQUAL 0)
    file(REMOVE ${OUT}.tmp)
    message(FATAL_ERROR "BpfObject.cmake: ${BPF_STEP} step failed (${rc}) for ${OUT}")
  endif()
  # Keep the old file (and its mtime) when nothing changed, so regenerating
  # vmlinux.h does not rebuild every BPF object.
  file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
  file(REMOVE ${OUT}.tmp)
  return()
endif()

include_guard(GLOBAL)

# --- tools ----------------------------------------------------------------------
find_program(BPF_CLANG NAMES clang clang-14 REQUIRED
  DOC "clang used to compile BPF C (-target bpf)")
# Debian installs bpftool in /usr/sbin, which is not on a non-root PATH.
find_program(BPFTOOL NAMES bpftool PATHS /usr/sbin /sbin /usr/local/sbin REQUIRED
  DOC "bpftool used to dump vmlinux.h and generate skeletons")
find_program(BPF_LLVM_STRIP NAMES llvm-strip llvm-strip-14
  DOC "llvm-strip used to drop DWARF from BPF objects (optional)")

set(BPF_VMLINUX_BTF "/sys/kernel/btf/vmlinux" CACHE FILEPATH
  "Kernel BTF that vmlinux.h is generated from at build time")
set(BPF_VMLINUX_H "" CACHE FILEPATH
  "A pre-generated vmlinux.h to use instead of dumping BPF_VMLINUX_BTF")

# __TARGET_ARCH_xxx selects the pt_regs layout in bpf_tracing.h.
string(TOLOWER "${CMAKE_SYSTEM_PROCESSOR}" _bpf_proc)
if(_bpf_proc MATCHES "^(x86_64|amd64|i[3-6]86|x86)$")
  set(BPF_TARGET_ARCH x86)
elseif(_bpf_proc MATCHES "^(aarch64|arm64)")
  set(BPF_TARGET_ARCH arm64)
elseif(_bpf_proc MATCHES "^arm")
  set(BPF_TARGET_ARCH arm)
elseif(_bpf_proc MATCHES "^(ppc|powerpc)")
  set(BPF_TARGET_ARCH powerpc)
elseif(_bpf_proc MATCHES "^s390")
  set(BPF_TARGET_ARCH s390)
elseif(_bpf_proc MATCHES "^riscv")
  set(BPF_TARGET_ARCH riscv)
elseif(_bpf_proc MATCHES "^loongarch")
  set(BPF_TARGET_ARCH loongarch)
else()
  message(FATAL_ERROR "bpf_object: no BPF target arch for CMAKE_SYSTEM_PROCESSOR "
                      "'${CMAKE_SYSTEM_PROCESSOR}'")
endif()

set(_BPF_OBJECT_SCRIPT ${CMAKE_CURRENT_LIST_FILE})

# --- vmlinux.h, once per build directory ------------------------------------------
# The custom command lives in the directory of the first bpf_object() call;
# other directories reach it through the bpf_vmlinux_h target.
function(_bpf_vmlinux_h out_var)
  set(dir ${CMAKE_BINARY_DIR}/bpf-vmlinux)
  set(header ${dir}/vmlinux.h)
  if(NOT TARGET bpf_vmlinux_h)
    file(MAKE_DIRECTORY ${dir})
    if(BPF_VMLINUX_H)
      add_custom_command(
        OUTPUT ${header}
        COMMAND ${CMAKE_COMMAND} -E copy_if_different ${BPF_VMLINUX_H} ${header}
        DEPENDS ${BPF_VMLINUX_H}
        COMMENT "vmlinux.h from ${BPF_VMLINUX_H}"
        VERBATIM)
    else()
      if(NOT EXISTS ${BPF_VMLINUX_BTF})
        message(FATAL_ERROR
          "bpf_object: ${BPF_VMLINUX_BTF} does not exist (kernel built without "
          "CONFIG_DEBUG_INFO_BTF?). Set BPF_VMLINUX_H to a pre-generated vmlinux.h.")
      endif()
      # No DEPENDS on the sysfs file: generated once per build directory.
      # Delete ${header} to regenerate it for another kernel.
      add_custom_command(
        OUTPUT ${header}
        COMMAND ${CMAKE_COMMAND} -DBPF_STEP=vmlinux -DBPFTOOL=${BPFTOOL}
                -DBTF=${BPF_VMLINUX_BTF} -DOUT=${header} -P ${_BPF_OBJECT_SCRIPT}
        DEPENDS ${_BPF_OBJECT_SCRIPT}
        COMMENT "vmlinux.h from ${BPF_VMLINUX_BTF}"
        VERBATIM)
    endif()
    add_custom_target(bpf_vmlinux_h DEPENDS ${header})
  endif()
  set(${out_var} ${header} PARENT_SCOPE)
endfunction()

# --- bpf_object(NAME SOURCE) --------------------------------------------------------
function(bpf_object name source)
  get_filename_component(src ${source} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
  _bpf_vmlinux_h(vmlinux_h)
  get_filename_component(vmlinux_dir ${vmlinux_h} DIRECTORY)

  set(out_dir ${CMAKE_CURRENT_BINARY_DIR}/${name}.skel)
  set(obj ${out_dir}/${name}.bpf.o)
  set(dep ${out_dir}/${name}.bpf.d)
  set(skel ${out_dir}/${name}.skel.h)
  file(MAKE_DIRECTORY ${out_dir})

  set(includes -isystem ${vmlinux_dir} -I${PROJECT_SOURCE_DIR}/bpf/lib)
  foreach(dir IN LISTS LIBBPF_INCLUDE_DIRS)
    list(APPEND includes -idirafter ${dir})
  endforeach()

  set(strip_cmd)
  if(BPF_LLVM_STRIP)
    # DWARF is only useful to humans; BTF (kept) is what the loader needs.
    # Stripping keeps the object embedded in the binary small.
    set(strip_cmd COMMAND ${BPF_LLVM_STRIP} -g ${obj})
  endif()

  add_custom_command(
    OUTPUT ${obj}
    COMMAND ${BPF_CLANG} -O2 -g -target bpf -D__TARGET_ARCH_${BPF_TARGET_ARCH}
            -Wall -Wextra -Werror ${includes}
            -MD -MF ${dep} -MT ${obj}
            -c ${src} -o ${obj}
    ${strip_cmd}
    DEPENDS ${src} ${vmlinux_h} bpf_vmlinux_h
    DEPFILE ${dep}
    COMMENT "BPF ${name}: clang -target bpf ${source}"
    VERBATIM)

  add_custom_command(
    OUTPUT ${skel}
    COMMAND ${CMAKE_COMMAND} -DBPF_STEP=skeleton -DBPFTOOL=${BPFTOOL}
            -DOBJ=${obj} -DSKEL_NAME=${name}_bpf -DOUT=${skel} -P ${_BPF_OBJECT_SCRIPT}
    DEPENDS ${obj} ${_BPF_OBJECT_SCRIPT}
    COMMENT "BPF ${name}: bpftool gen skeleton"
    VERBATIM)

  # Listing the header as a source makes NAME_skel a buildable target
  # (`ninja NAME_skel`) and orders it before every target that links it.
  add_library(${name}_skel INTERFACE ${skel})
  # SYSTEM: the generated skeleton does not get our -Werror.
  target_include_directories(${name}_skel SYSTEM INTERFACE ${out_dir})
  # The shared libbpf pulls in libelf and zlib itself; a static libbpf would
  # need LIBBPF_STATIC_LIBRARIES (-lbpf -lelf -lz) instead.
  target_link_libraries(${name}_skel INTERFACE PkgConfig::LIBBPF)
endfunction()
