#!/usr/bin/env bash
# The lent GPU machine, first call: stage what this call carried and make WMRL runnable there.
#
# That machine (docs/benchmarks/gpu.md, "The GPU check") has its own Python with torch, transformers,
# peft, accelerate, pandas and scikit-learn, no network, and takes at most 64 MiB per call, the
# working tree included. So the carried folder .device/ (git-ignored; made by
# benchmarks/device/pack.sh) holds what the image lacks, and the embedded model travels in two
# parts, one per call:
#
#   .device/a/model.xz.00     the first part of SmolLM2-135M-Instruct.Q4_1.gguf, xz-compressed (this call)
#   .device/a/wheels/         trl, datasets (two versions: the one the image's pyarrow takes is used),
#                             gguf, dill, multiprocess, pyseccomp, gymnasium (the embodied check);
#                             wheels/solution/: lightgbm (the solutions')
#   .device/a/debs/           libseccomp2 and libgomp1, unpacked only where the image lacks them
#   .device/b/model.xz.01     the rest of the model (the second call: benchmarks/device/run.sh)
#
# Everything goes to /tmp/wmrl-device (which stays while the machine is warm between calls):
# site/ (trainer-side packages), wmrl/ (this repository, installed), solution-env/ (the sandbox's
# interpreter: benchmarks/device/solution_env_shim.py), env.sh (the variables run.sh sources).
# Ends with a probe (versions, GPU, CPUs) and one real sandbox execution, in $OUT/prepare.json;
# $STAGE/ready marks a machine where both worked.
set -euo pipefail
cd "$(dirname "$0")/../.."
STAGE=/tmp/wmrl-device
CARRY=.device/a
OUT="${OUT:-$STAGE/out}"
mkdir -p "$STAGE" "$OUT"
t0=$(date +%s)
cp "$CARRY"/model.xz.* "$STAGE"/

# System libraries the sandbox and lightgbm load, only where the image has none.
for lib in libseccomp.so.2 libgomp.so.1; do
  if ! ldconfig -p | grep -q "$lib"; then
    for deb in "$CARRY"/debs/*.deb; do dpkg -x "$deb" "$STAGE/sysroot"; done
    echo "$STAGE/sysroot/usr/lib/x86_64-linux-gnu" >/etc/ld.so.conf.d/wmrl-device.conf
    ldconfig
    echo "prepare: $lib was missing; unpacked from the carried .deb"
  fi
done

PIP=(python3 -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check)
pyarrow_major=$(python3 -c "import pyarrow; print(pyarrow.__version__.split('.')[0])")
if [ "$pyarrow_major" -ge 24 ]; then datasets=("$CARRY"/wheels/datasets-5.*.whl); else datasets=("$CARRY"/wheels/datasets-4.*.whl); fi
trainer=()
for w in "$CARRY"/wheels/*.whl; do case "$(basename "$w")" in datasets-*) ;; *) trainer+=("$w") ;; esac; done
"${PIP[@]}" --target "$STAGE/site" "${trainer[@]}" "${datasets[@]}"
"${PIP[@]}" --target "$STAGE/solution-extra" "$CARRY"/wheels/solution/*.whl
# WMRL itself, not editable and outside the image's site-packages, so that the solution
# environment (which links those) never holds it.
"${PIP[@]}" --no-build-isolation --target "$STAGE/wmrl" .

cat >"$STAGE/env.sh" <<EOF
export PYTHONPATH="$STAGE/site:$STAGE/wmrl"
export WMRL_SOLUTION_ENV="$STAGE/solution-env"
export WMRL_CACHE="$STAGE/cache"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled
export TRL_EXPERIMENTAL_SILENCE=1 PYTHONUNBUFFERED=1
EOF
# shellcheck disable=SC1091
source "$STAGE/env.sh"
python3 benchmarks/device/solution_env_shim.py --extra "$STAGE/solution-extra" >"$STAGE/solution-env.json"

# The probe, and one real execution through the sandbox the runs use.
python3 - "$OUT/prepare.json" "$t0" <<'EOF'
import importlib.metadata as md, json, os, platform, shutil, subprocess, sys, time

def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None

out, t0 = sys.argv[1], int(sys.argv[2])
names = ["torch", "transformers", "trl", "peft", "accelerate", "datasets", "numpy", "pandas", "pyarrow",
         "scikit-learn", "scipy", "gguf", "lightgbm", "vllm", "ray", "wmrl"]
probe = {
    "python": sys.version, "executable": sys.executable, "platform": platform.platform(),
    "cpus": os.cpu_count(), "versions": {n: version(n) for n in names},
    "system_python": os.path.realpath("/usr/bin/python3"),
    "nvidia_smi": subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
    if shutil.which("nvidia-smi") else None,
    "memory": open("/proc/meminfo").read().split("\n")[:3],
    "solution_env": json.load(open(os.environ["WMRL_SOLUTION_ENV"].rstrip("/") + ".json")),
}
import torch
probe["cuda"] = {"available": torch.cuda.is_available(), "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
done = subprocess.run(
    [sys.executable, "-m", "wmrl.core.cli", "autoresearch", "grade", "penguin-body-mass",
     "autoresearch/fidelity/corpus/penguin-body-mass/valid_forest.py", "--backend", "subprocess", "--json"],
    capture_output=True, text=True, timeout=300,
)
try:
    grade = json.loads(done.stdout)
    probe["sandbox_smoke"] = {k: grade.get(k) for k in ("status", "position", "medal", "reason", "stderr_tail")}
except ValueError:
    probe["sandbox_smoke"] = {"exit_code": done.returncode, "stdout": done.stdout[-1500:], "stderr": done.stderr[-3000:]}
probe["seconds"] = time.time() - t0
json.dump(probe, open(out, "w"), indent=1)
print(json.dumps(probe, indent=1))
if not probe["cuda"]["available"] or probe["sandbox_smoke"].get("status") != "valid":
    sys.exit("prepare: no GPU for torch, or the sandbox could not run a known-valid script: not ready")
EOF
touch "$STAGE/ready"  # run.sh starts only on a machine this script prepared in full
