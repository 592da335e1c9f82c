# The chat-template engine: llama.cpp's Jinja engine (common/jinja, MIT licence; it renders the
# templates of published models as transformers' apply_chat_template does, trim_blocks and
# lstrip_blocks included). Neither Debian nor PyPI ships a C++ Jinja library on its own; PyPI's
# llama-cpp-python source release vendors llama.cpp, so its pinned release is the source: the
# archive scripts/install_deps.sh downloads (the same one scripts/check_edge_runtimes.sh builds
# llama.cpp from), checked against its SHA-256 and unpacked here, at configure time, into the
# build folder. Nothing of it is copied into this repository.
#
#   FSDP_WITH_CHAT_TEMPLATES  ON (default); OFF builds fsdp::models::ChatTemplate as a stub that
#                             throws (a machine without the archive: the GPU check's build)
#   FSDP_LLAMA_CPP_SDIST      the archive (default: $FSDP_CACHE or ~/.cache/fsdp-cpp, then
#                             llama-cpp/llama_cpp_python-<version>.tar.gz)
#
# Defines the object library fsdp_llama_jinja (position-independent, hidden symbols, its own
# warnings off: it is not our code) and FSDP_LLAMA_JINJA_INCLUDE (its headers, for the one source
# that uses them). The version and checksum are read from scripts/lib.sh, the one place the
# scripts pin them; editing it reconfigures.
option(FSDP_WITH_CHAT_TEMPLATES
       "Chat templates (llama.cpp's Jinja engine, from llama-cpp-python's source release)" ON)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/scripts/lib.sh)
file(STRINGS ${PROJECT_SOURCE_DIR}/scripts/lib.sh _fsdp_lcp_lines
     REGEX "^LLAMA_CPP_PYTHON(_SHA256)?=")
foreach(_line IN LISTS _fsdp_lcp_lines)
  if(_line MATCHES "^LLAMA_CPP_PYTHON=([0-9.]+)")
    set(FSDP_LLAMA_CPP_PYTHON ${CMAKE_MATCH_1})
  elseif(_line MATCHES "^LLAMA_CPP_PYTHON_SHA256=([0-9a-f]+)")
    set(_fsdp_lcp_sha ${CMAKE_MATCH_1})
  endif()
endforeach()
if(NOT FSDP_LLAMA_CPP_PYTHON OR NOT _fsdp_lcp_sha)
  message(FATAL_ERROR "scripts/lib.sh does not pin LLAMA_CPP_PYTHON and LLAMA_CPP_PYTHON_SHA256")
endif()

# A plain variable unless given with -D: its default follows the pinned version.
if(NOT FSDP_LLAMA_CPP_SDIST)
  if(DEFINED ENV{FSDP_CACHE})
    set(_fsdp_cache $ENV{FSDP_CACHE})
  else()
    set(_fsdp_cache $ENV{HOME}/.cache/fsdp-cpp)
  endif()
  set(FSDP_LLAMA_CPP_SDIST
      ${_fsdp_cache}/llama-cpp/llama_cpp_python-${FSDP_LLAMA_CPP_PYTHON}.tar.gz)
endif()
if(NOT FSDP_WITH_CHAT_TEMPLATES)
  return()
endif()

# Unpacked once per checksum: a stamp holding it is written after the unpacked tree is moved
# into place, so an interrupted unpack is redone and a new pin unpacks anew. Once unpacked, the
# archive itself is no longer needed.
set(_fsdp_lcp_root ${PROJECT_BINARY_DIR}/_deps/llama_cpp_python)
set(_fsdp_lcp ${_fsdp_lcp_root}/llama_cpp_python-${FSDP_LLAMA_CPP_PYTHON}/vendor/llama.cpp)
set(_fsdp_lcp_stamp ${_fsdp_lcp_root}/unpacked.sha256)
set(_fsdp_lcp_done "")
if(EXISTS ${_fsdp_lcp_stamp})
  file(READ ${_fsdp_lcp_stamp} _fsdp_lcp_done)
  string(STRIP "${_fsdp_lcp_done}" _fsdp_lcp_done)
endif()
if(NOT _fsdp_lcp_done STREQUAL _fsdp_lcp_sha)
  if(NOT EXISTS ${FSDP_LLAMA_CPP_SDIST})
    message(FATAL_ERROR
            "${FSDP_LLAMA_CPP_SDIST} not found: the chat-template engine (llama.cpp's Jinja) comes "
            "from llama-cpp-python ${FSDP_LLAMA_CPP_PYTHON}'s source release. "
            "scripts/install_deps.sh downloads it; or: pip download --no-deps --no-binary :all: "
            "llama-cpp-python==${FSDP_LLAMA_CPP_PYTHON} -d <dir>, then "
            "-DFSDP_LLAMA_CPP_SDIST=<dir>/llama_cpp_python-${FSDP_LLAMA_CPP_PYTHON}.tar.gz; or "
            "-DFSDP_WITH_CHAT_TEMPLATES=OFF (no chat templates)")
  endif()
  file(SHA256 ${FSDP_LLAMA_CPP_SDIST} _sha)
  if(NOT _sha STREQUAL _fsdp_lcp_sha)
    message(FATAL_ERROR "${FSDP_LLAMA_CPP_SDIST}: SHA-256 ${_sha}, expected ${_fsdp_lcp_sha} "
                        "(llama-cpp-python ${FSDP_LLAMA_CPP_PYTHON} from PyPI); delete it and "
                        "run scripts/install_deps.sh again")
  endif()
  set(_p llama_cpp_python-${FSDP_LLAMA_CPP_PYTHON}/vendor/llama.cpp)
  file(REMOVE_RECURSE ${_fsdp_lcp_root} ${_fsdp_lcp_root}.tmp)
  file(ARCHIVE_EXTRACT INPUT ${FSDP_LLAMA_CPP_SDIST} DESTINATION ${_fsdp_lcp_root}.tmp
       PATTERNS ${_p}/LICENSE ${_p}/common/jinja ${_p}/common/json.h ${_p}/common/json.cpp
                ${_p}/common/unicode.h ${_p}/common/unicode.cpp ${_p}/vendor/nlohmann)
  file(RENAME ${_fsdp_lcp_root}.tmp ${_fsdp_lcp_root})
  file(WRITE ${_fsdp_lcp_stamp} "${_fsdp_lcp_sha}\n")
endif()

add_library(fsdp_llama_jinja OBJECT
            ${_fsdp_lcp}/common/jinja/lexer.cpp ${_fsdp_lcp}/common/jinja/parser.cpp
            ${_fsdp_lcp}/common/jinja/runtime.cpp ${_fsdp_lcp}/common/jinja/value.cpp
            ${_fsdp_lcp}/common/jinja/string.cpp ${_fsdp_lcp}/common/jinja/caps.cpp
            ${_fsdp_lcp}/common/json.cpp ${_fsdp_lcp}/common/unicode.cpp)
# Hidden: the engine's symbols stay inside libfsdp_models, so that a process that also loads
# llama.cpp (its own copy of the engine, perhaps another version) gets no clash.
set_target_properties(fsdp_llama_jinja PROPERTIES POSITION_INDEPENDENT_CODE ON CXX_STANDARD 17
                                                  CXX_EXTENSIONS OFF UNITY_BUILD OFF
                                                  CXX_VISIBILITY_PRESET hidden
                                                  VISIBILITY_INLINES_HIDDEN ON)
# json.cpp includes ggml.h for one assertion macro only: the shim gives it that macro (a throw),
# so the engine needs none of ggml. llama.cpp's own nlohmann/json (a newer release than Debian's;
# its inline ABI namespace keeps the two apart) serves json.cpp.
target_include_directories(fsdp_llama_jinja SYSTEM PRIVATE
                           ${PROJECT_SOURCE_DIR}/cmake/llama_jinja_shim ${_fsdp_lcp}/common
                           ${_fsdp_lcp}/vendor)
target_compile_options(fsdp_llama_jinja PRIVATE -w)
set(FSDP_LLAMA_JINJA_INCLUDE ${_fsdp_lcp}/common)
