# Sourced by the project's scripts (scripts/, bench/, tests/): what they share, in one place.
#   FSDP_ROOT    the repository
#   FSDP_VENV    the virtual environment with libtorch (scripts/install_deps.sh fills it)
#   FSDP_PY      its Python (FSDP_PYTHON overrides: the one CMake found, say)
#   FSDP_MPIRUN  mpirun and the flags every launch here needs (an array): --oversubscribe
#                (more ranks than cores), and --allow-run-as-root when running as root
FSDP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FSDP_VENV="${FSDP_VENV:-$HOME/.cache/fsdp-cpp/venv}"
FSDP_PY="${FSDP_PYTHON:-$FSDP_VENV/bin/python}"
FSDP_MPIRUN=(mpirun --oversubscribe)
if [ "$(id -u)" -eq 0 ]; then FSDP_MPIRUN+=(--allow-run-as-root); fi
