#!/usr/bin/env bash
# On the CPU machine, from the project root: the wheels a GPU machine without network needs to
# run R3's tests and benchmarks (.device/, ignored by git; carry it and start each command there
# with `source .device/setup.sh &&`). The lender's kit brings pycuda and the pure-Python
# dependencies it knows of; this adds the rest of pyproject.toml's runtime and dask
# dependencies, with their own dependencies, for the GPU image's Python 3.12.
set -euo pipefail
cd "$(dirname "$0")/.."
kit=${R3_DEVICE_KIT:-../shared/device-kit/fetch-wheels.sh}
bash "$kit"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 -d .device/wheels \
  tree-sitter==0.26.1 tree-sitter-cuda==0.21.2 \
  distributed==2026.8.0 dask==2026.8.0 dask-jobqueue==0.9.0
du -sh .device
