#!/usr/bin/env bash
# Packs vLLM for a GPU host that has PyTorch but no package registry, for
# tests/gpu/vllm_engine.py: the release whose torch pin is the host's (0.26.0 for torch
# 2.11), trimmed to what a dense Llama on Hopper loads (FlashAttention 3 and the core
# ops; not FA2, the MoE ops, FlashMLA, qutlass, DeepGEMM, the SM100 kernels or vllm-rs),
# and the small wheels its offline engine imports. Writes DIR/part.aa, part.ab, ... (xz,
# under the device tool's 64 MiB per call: carry one part per call, back to back, and
# join them on the host) and prints the host's commands.
#   tests/gpu/vllm_site.sh [DIR]    (default .vllm-parts, keep it out of git)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$(realpath -m "${1:-.vllm-parts}")
VLLM=0.26.0
tmp=$(mktemp -d /tmp/ferry-vllm-site.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
dl() {  # wheels for the host's CPython 3.12, without their dependencies
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 -d "$@"
}
dl "$tmp" "vllm==$VLLM"
mkdir -p "$tmp/pack/site" "$tmp/pack/whl"
unzip -q "$tmp"/vllm-"$VLLM"-*.whl -d "$tmp/pack/site"
v=$tmp/pack/site/vllm
rm -rf "$v"/vllm_flash_attn/_vllm_fa2_C.abi3.so "$v"/_moe_C_stable_libtorch.abi3.so "$v"/vllm-rs \
  "$v"/third_party/deep_gemm "$v"/third_party/fmha_sm100 "$v"/_flashmla_C.abi3.so "$v"/_flashmla_extension_C.abi3.so \
  "$v"/_qutlass_C.abi3.so
# What `from vllm import LLM` imports that the host lacks (pydantic 2.13 needs a newer
# typing_extensions than the host's; xgrammar 0.2.8 needs apache-tvm-ffi 0.1.11).
dl "$tmp/pack/whl" "pydantic==2.13.5" "pydantic-core==2.46.5" annotated-types typing-inspection annotated-doc \
  "fastapi>=0.133,<0.137" "starlette>=1.0.1" "openai>=2,<3" distro jiter sniffio openai-harmony msgspec pyzmq \
  cachetools cbor2 pybase64 partial-json-parser "llguidance>=1.7,<1.8" xgrammar==0.2.8 apache-tvm-ffi==0.1.11 \
  setproctitle blake3 "typing_extensions>=4.14.1"
rm -rf "$out" && mkdir -p "$out"
tar -C "$tmp/pack" -cf - . | xz -T0 -6 | split -b 55000000 - "$out/part."
ls -la "$out"
cat <<EOF
On the GPU host, after carrying every part (the first into /tmp/stash, the last with the call that runs):
  cat /tmp/stash/part.* PARTS/part.LAST | xz -d | tar -C /tmp/vl -x
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/vl/whl/*.whl && cp -r /tmp/vl/site/* /tmp/site/
  PYTHONPATH=/tmp/site:\$PWD/.gpu-python python3 tests/gpu/vllm_engine.py --ferryd=BUNDLE/bin/ferryd
EOF
