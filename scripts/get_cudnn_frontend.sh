#!/usr/bin/env bash
# Fetches cuDNN's header-only C++ frontend (the `nvidia-cudnn-frontend` wheel from PyPI) into
# build/cudnn_frontend/include, where the kernel lab's `make -C dev/cuda USE_CUDNN=1` looks for it
# (CUDNN_FRONTEND_PATH): its attention labs time cuDNN beside ours. The trainer never uses cuDNN.
# cuDNN 9 itself (libcudnn) must be installed with the CUDA toolkit. Needs pip and network.
# Usage: scripts/get_cudnn_frontend.sh [--help]   (replaces an existing build/cudnn_frontend)
set -euo pipefail
if [[ $# -gt 0 ]]; then
    if [[ $# -eq 1 && ( $1 == --help || $1 == -h ) ]]; then
        awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"  # this header
        exit 0
    fi
    echo "error: $1: unknown argument (get_cudnn_frontend.sh takes only --help)" >&2
    exit 1
fi
cd "$(dirname "$0")/.."
dest=build/cudnn_frontend
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps nvidia-cudnn-frontend -d "$tmp"
rm -rf "$dest" && mkdir -p "$dest"
python3 -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); [z.extract(n, sys.argv[2]) for n in z.namelist() if n.startswith('include/')]" \
    "$(ls "$tmp"/*.whl | head -1)" "$dest"
echo "cudnn_frontend headers in $dest/include ($(ls "$dest/include" | wc -l) files)"
