#!/usr/bin/env bash
# Builds tools/fakecuda/libcuda.so.1 (the CPU stand-in for the driver) with the system C compiler and the CUDA
# headers of the nvidia-cuda-runtime wheel or a CUDA toolkit.  Prints the directory to put on LD_LIBRARY_PATH.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
inc=${CUDA_INCLUDE:-}
if [[ -z $inc ]]; then
  for d in /usr/local/cuda/include /usr/local/cuda-13*/include \
           $(python3 -c 'import nvidia, os; print(" ".join(p + "/cu13/include" for p in nvidia.__path__))' 2>/dev/null); do
    [[ -f $d/cuda.h ]] && { inc=$d; break; }
  done
fi
[[ -n $inc && -f $inc/cuda.h ]] || { echo "fakecuda: no cuda.h found; set CUDA_INCLUDE" >&2; exit 1; }
out=${FAKECUDA_DIR:-$here/build}
mkdir -p "$out"
lib="$out/libcuda.so.1"
if [[ -f $lib && -z $(find "$here" -maxdepth 1 -name "*.[ch]" -newer "$lib") ]]; then
  echo "$out"; exit 0
fi
cc -std=c11 -shared -fPIC -O1 -g -ffp-contract=off -Wall -Wextra -I"$inc" -o "$lib" "$here"/*.c
echo "$out"
