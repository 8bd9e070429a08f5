#!/usr/bin/env bash
# Packs what the GPU suite and benchmark need into one folder for a GPU host that has
# the NVIDIA driver but none of ferry's build dependencies (no Bazel, no apt, no gRPC):
#   <dir>/bin  ferryd, ferryctl, gpu_test, gpu_bench, copy_kernel_bench, write_windows_bench, fi_write_bench, ferry_bench, demo_pod,
#              grpc_echo (optimized builds), and iproute2's ip (GPU hosts may lack it; the rail test
#              makes network namespaces)
#   <dir>/lib  every shared library they load except glibc's and the C++ runtime, and
#              libferry_rpc.so (the Python client's unary calls)
# Usage: tests/gpu/bundle.sh [dir]   (default .gpu-bundle, ignored by git)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-.gpu-bundle}
bash tools/setup.sh
bazel build -c opt //agent/main:ferryd //tools/ferryctl //tests/gpu:gpu_test //tools/bench:gpu_bench //tools/bench:fi_write_bench //tools/bench:ferry_bench //tools/bench:copy_kernel_bench //tools/bench:write_windows_bench //tools/demo:demo_pod \
  //tools/bench:grpc_echo //client/native:libferry_rpc.so 2>&1 | tail -n 1
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
bins=(agent/main/ferryd tools/ferryctl/ferryctl tests/gpu/gpu_test tools/bench/gpu_bench tools/bench/fi_write_bench tools/bench/ferry_bench tools/bench/copy_kernel_bench tools/bench/write_windows_bench tools/demo/demo_pod
      tools/bench/grpc_echo)
for b in "${bins[@]}"; do cp -L "bazel-bin/$b" "$out/bin/"; done
cp -L bazel-bin/client/native/libferry_rpc.so "$out/lib/"  # the Python client's unary calls (client/native)
cp -L "$(command -v ip)" "$out/bin/"
ldd "${bins[@]/#/bazel-bin/}" "$(command -v ip)" | awk '/=> \//{print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|libresolv|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
strip --strip-unneeded "$out"/bin/* "$out"/lib/* 2>/dev/null || true
du -sh "$out" | awk '{print "bundle: " $1 " in '"$out"'"}'
