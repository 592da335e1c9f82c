# The text library, fsdp_text (fsdp::text; headers in include/fsdp/text): a Hugging Face
# tokenizer.json's byte-level BPE and chat templates, what a program needs to turn text into a
# model's ids and back. Optional, so that libfsdp, fsdp_models and the trainers build and run
# without its dependencies (the GPU bundle then needs nothing beyond the torch wheels):
#
#   FSDP_WITH_TEXT  AUTO (default): built where PCRE2 and utf8proc are found; ON: required (the
#                   configure fails naming what is missing); OFF: not built. Without it,
#                   train_llama refuses --generate TEXT and --chat by name (--generate-ids works).
#   FSDP_WITH_CHAT_TEMPLATES  (cmake/FsdpLlamaJinja.cmake) the template engine inside it.
#
# Its dependencies: PCRE2, for the pre-tokenizers' regexes with Unicode properties (\p{L}), which
# std::regex does not know; utf8proc, for NFC normalization (Qwen2's tokenizer); llama.cpp's
# Jinja engine, from llama-cpp-python's pinned source release. Debian: libpcre2-dev and
# libutf8proc-dev, which scripts/install_deps.sh installs. Sets FSDP_HAVE_TEXT and
# FSDP_HAVE_CHAT_TEMPLATES (both ON where the library and its template engine are built).
set(FSDP_WITH_TEXT AUTO CACHE STRING
    "Build fsdp::text, the tokenizer and chat templates (AUTO/ON/OFF; needs PCRE2 and utf8proc)")
set_property(CACHE FSDP_WITH_TEXT PROPERTY STRINGS AUTO ON OFF)
set(FSDP_HAVE_TEXT OFF)
set(FSDP_HAVE_CHAT_TEMPLATES OFF)
if(FSDP_WITH_TEXT STREQUAL "OFF")
  message(STATUS "fsdp: text library (tokenizer, chat templates): off (FSDP_WITH_TEXT=OFF)")
  return()
endif()

find_path(FSDP_PCRE2_INCLUDE pcre2.h)
find_library(FSDP_PCRE2_LIBRARY pcre2-8)
find_path(FSDP_UTF8PROC_INCLUDE utf8proc.h)
find_library(FSDP_UTF8PROC_LIBRARY utf8proc)
if(NOT FSDP_PCRE2_INCLUDE OR NOT FSDP_PCRE2_LIBRARY OR NOT FSDP_UTF8PROC_INCLUDE
   OR NOT FSDP_UTF8PROC_LIBRARY)
  set(_missing "PCRE2 (pcre2.h, libpcre2-8) or utf8proc (utf8proc.h, libutf8proc) not found")
  if(FSDP_WITH_TEXT STREQUAL "ON")
    message(FATAL_ERROR "FSDP_WITH_TEXT=ON but ${_missing}: the tokenizer needs them (Debian: "
                        "apt-get install libpcre2-dev libutf8proc-dev; scripts/install_deps.sh "
                        "does), or configure with -DFSDP_WITH_TEXT=OFF")
  endif()
  message(STATUS "fsdp: text library (tokenizer, chat templates): off, ${_missing} (Debian: "
                 "libpcre2-dev libutf8proc-dev)")
  return()
endif()

add_library(fsdp_text SHARED src/text/tokenizer.cpp src/text/chat_template.cpp)
add_library(fsdp::text ALIAS fsdp_text)
# fsdp: the error types and file helpers (fsdp/errors.h, fsdp/io/files.h), and fmt's headers.
target_link_libraries(fsdp_text PUBLIC fsdp PRIVATE nlohmann_json::nlohmann_json
                      ${FSDP_PCRE2_LIBRARY} ${FSDP_UTF8PROC_LIBRARY})
target_include_directories(fsdp_text SYSTEM PRIVATE ${FSDP_PCRE2_INCLUDE}
                           ${FSDP_UTF8PROC_INCLUDE})
fsdp_program_flags(fsdp_text)
# $ORIGIN: the installed library finds libfsdp beside it (as fsdp_models).
set_target_properties(fsdp_text PROPERTIES EXPORT_NAME text VERSION ${PROJECT_VERSION}
                                           SOVERSION 0 INSTALL_RPATH "\$ORIGIN"
                                           INSTALL_RPATH_USE_LINK_PATH TRUE)

# Chat templates: llama.cpp's Jinja engine, built from llama-cpp-python's pinned source release;
# its objects go into libfsdp_text and its headers are seen by chat_template.cpp alone.
include(FsdpLlamaJinja)
if(FSDP_WITH_CHAT_TEMPLATES)
  target_sources(fsdp_text PRIVATE $<TARGET_OBJECTS:fsdp_llama_jinja>)
  set_source_files_properties(src/text/chat_template.cpp PROPERTIES
                              COMPILE_OPTIONS "-isystem;${FSDP_LLAMA_JINJA_INCLUDE}")
else()
  set_source_files_properties(src/text/chat_template.cpp PROPERTIES
                              COMPILE_DEFINITIONS FSDP_NO_CHAT_TEMPLATES)
endif()
set(FSDP_HAVE_TEXT ON)
if(FSDP_WITH_CHAT_TEMPLATES)
  set(FSDP_HAVE_CHAT_TEMPLATES ON)
  message(STATUS "fsdp: text library (tokenizer, chat templates): on")
else()
  message(STATUS "fsdp: text library: on, without chat templates (FSDP_WITH_CHAT_TEMPLATES=OFF)")
endif()
