# Writes a C file holding every file of a folder that matches a pattern, so
# that a binary needs no files beside it (chargectl migrate's migrations,
# the console's page). Run by CMake at build time:
#   cmake -DSRC_DIR=... -DOUT=... -DPATTERN=*.sql -DHEADER=migrate.h
#         -DTYPE=migrate_file -DTABLE=migrate_embedded -P embed_files.cmake
# TYPE is a struct of {const char *name; const char *bytes; size_t len;};
# TABLE names the array and, with _count, its length.
# -DEXTRA_GLOB=<absolute glob> adds the files it matches (the operations'
# migrations, worker/operations/*/migrations/*.sql), each named by its file
# name and sorted by it with the folder's; two files of one name are an
# error.
file(GLOB found "${SRC_DIR}/${PATTERN}")
if(DEFINED EXTRA_GLOB AND NOT EXTRA_GLOB STREQUAL "")
  file(GLOB extra "${EXTRA_GLOB}")
  list(APPEND found ${extra})
endif()
set(files "")
foreach(path ${found})
  get_filename_component(f "${path}" NAME)
  if(DEFINED path_of_${f})
    message(FATAL_ERROR "embed_files: ${f} twice: ${path_of_${f}} and ${path}")
  endif()
  set(path_of_${f} "${path}")
  list(APPEND files "${f}")
endforeach()
list(SORT files)
set(body "/* generated from ${PATTERN} by tools/embed_files.cmake */\n")
string(APPEND body "#include \"${HEADER}\"\n\n")
set(table "const struct ${TYPE} ${TABLE}[] = {\n")
set(i 0)
foreach(f ${files})
  file(READ "${path_of_${f}}" hex HEX)
  string(LENGTH "${hex}" hexlen)
  math(EXPR len "${hexlen} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  string(APPEND body "static const char m${i}[] = {${bytes}0};\n")
  string(APPEND table "    {\"${f}\", m${i}, ${len}},\n")
  math(EXPR i "${i} + 1")
endforeach()
string(APPEND table "};\nconst size_t ${TABLE}_count = ${i};\n")
file(WRITE "${OUT}.tmp" "${body}\n${table}")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different "${OUT}.tmp" "${OUT}")
file(REMOVE "${OUT}.tmp")
