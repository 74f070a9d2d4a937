#!/usr/bin/env bash
# The GPU check (issue 16): on a CUDA machine whose Python already has torch, install the project, then run
# each phase under its own time box and all of them inside one budget (default 8 min): the CUDA tests, a
# GPU-sized bootstrap policy, a drafter warm start, `bench sd`, `bench rollout` (if present) and a short
# `bench e2e` on CUDA. OUT (default ./gpu-check-out) gets one log, the benches' JSON, the tests' JUnit XML and
# summary.json (every phase: status ok|failed|timeout|skipped|absent, seconds, detail); few files, so the device
# tool brings them all back. Work files (policy, drafter, e2e runs, carried wheels) go to --work.
#
#   bash scripts/gpu_check.sh [--out DIR] [--work DIR] [--budget SECONDS] [--python PY] [--wheels DIR]
#   bash scripts/gpu_check.sh --dry-run   # the same phases on CPU, tiny sizes, few steps (tests/test_gpu_check.py)
#   bash scripts/gpu_check.sh --fetch-wheels [DIR]   # here, with internet: the wheels the GPU machine lacks
#
# GPU_CHECK_BOX_SCALE=N (whole number, default 1) multiplies every phase's time box (the budget still bounds
# them): tests/test_gpu_check.py's dry run on a loaded CI machine, where a box sized for an idle one is no check.
#
# On the lent H200 (torch 2.11, transformers 5.17, no internet): first `--fetch-wheels .whl` here (.whl
# ignored by git), then on the device `bash scripts/gpu_check.sh` with `.whl` carried. Exit status: 0 when
# every phase is ok (or absent: `bench rollout` on a checkout without it).
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0 BUDGET="" PY="" WHEELS="" OUT_DIR="${OUT:-./gpu-check-out}" WORK=""
declare -A BOX  # phase -> time box, seconds
# What the GPU image lacks or holds too old, pinned to this checkout's venv (the versions CI tests with).
WHEEL_NAMES="transformers regex fastapi starlette pydantic pydantic_core annotated-types typing-inspection
  typing_extensions opentelemetry-api uvicorn"
while (($#)); do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUT_DIR=${2:?--out needs a value}; shift ;;
    --work) WORK=${2:?--work needs a value}; shift ;;
    --budget) BUDGET=${2:?--budget needs a value}; shift ;;
    --python) PY=${2:?--python needs a value}; shift ;;
    --wheels) WHEELS=${2:?--wheels needs a value}; shift ;;
    --fetch-wheels) FETCH=${2:-.whl}; [[ ${2:-} && ${2:-} != --* ]] && shift ;;
    *) echo "gpu_check.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[[ -z $PY ]] && { [[ -x .venv/bin/python ]] && PY=.venv/bin/python || PY=python3; }

if [[ -n ${FETCH:-} ]]; then
  pins=()
  for name in $WHEEL_NAMES; do
    version=$("$PY" -m pip show "$name" 2>/dev/null | awk '/^Version:/{print $2}')
    [[ -n $version ]] || { echo "gpu_check.sh: $name is not installed in $PY; cannot pin it" >&2; exit 2; }
    pins+=("$name==$version")
  done
  platforms=()
  for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
    platforms+=(--platform "$p")
  done
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$FETCH" "${pins[@]}" || exit 1
  echo "wheels for the GPU machine in $FETCH (${pins[*]}); carry that folder"
  exit 0
fi

if ((DRY)); then
  DEVICE=cpu SIZE=tiny BUDGET=${BUDGET:-170}
  DRAFT_ARGS=(--num-prompts 8 --max-new-tokens 24 --steps 4 --eval-every 2 --gen-batch 8 --batch-size 8 --topk 16
              --heldout 0.25)
  SD_ARGS=(--batches 1,2 --temperatures 0 --max-new-tokens 16 --repeats 1 --dtype float32)
  ROLLOUT_ARGS=(--prompts 2 --n 2 --steps 1 --max-new-tokens 16 --dtype float32 --arms plain,eagle,group,fused)
  E2E_ARGS=(--steps 1 --prompts-per-step 2 --samples-per-prompt 2 --max-new-tokens 16 --dtype float32
            --arms a_no_sd,b_adaptive,c_stale)
  BOX=([install]=30 [tests]=90 [bootstrap]=60 [draft]=40 [sd]=30 [rollout]=30 [e2e]=90)
else
  DEVICE=cuda SIZE=gpu BUDGET=${BUDGET:-480}
  DRAFT_ARGS=(--num-prompts 256 --max-new-tokens 256 --steps 300 --eval-every 100 --gen-batch 64 --accept-k 6
              --ttt-length 5)
  SD_ARGS=(--batches 1,16 --temperatures 0,1 --max-new-tokens 256 --repeats 2)
  ROLLOUT_ARGS=(--steps 1 --dtype bfloat16 --arms plain,eagle,group,fused)
  E2E_ARGS=(--steps 2 --prompts-per-step 4 --samples-per-prompt 4 --max-new-tokens 128 --dtype bfloat16
            --arms a_no_sd,b_adaptive,c_stale)
  BOX=([install]=60 [tests]=100 [bootstrap]=90 [draft]=90 [sd]=90 [rollout]=60 [e2e]=150)
fi
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "gpu_check.sh: --budget must be whole seconds, got $BUDGET" >&2; exit 2; }
BOX_SCALE=${GPU_CHECK_BOX_SCALE:-1}
[[ $BOX_SCALE =~ ^[1-9][0-9]*$ ]] || {
  echo "gpu_check.sh: GPU_CHECK_BOX_SCALE must be a whole number >= 1, got $BOX_SCALE" >&2; exit 2; }
for p in "${!BOX[@]}"; do BOX[$p]=$((BOX[$p] * BOX_SCALE)); done
WORK=${WORK:-${TMPDIR:-/tmp}/gleanrl-gpu-check}
[[ -z $WHEELS && -d .whl ]] && WHEELS=.whl
mkdir -p "$OUT_DIR" "$WORK" && rm -f "$OUT_DIR"/{gpu_check.log,summary.json,sd.json,rollout.json,e2e.json,tests.xml}
OUT_DIR=$(cd "$OUT_DIR" && pwd) WORK=$(cd "$WORK" && pwd)
LOG=$OUT_DIR/gpu_check.log PHASES=$WORK/phases.tsv
: >"$PHASES"
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=10 TOKENIZERS_PARALLELISM=false
START=$SECONDS

record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$PHASES"; echo "--- $1: $2 ($3 s) $4" | tee -a "$LOG"; }

phase() {  # phase NAME CMD...: run CMD under min(its time box, budget left); record how it ended
  local name=$1 box=${BOX[$1]} left=$((BUDGET - (SECONDS - START))) t0=$SECONDS rc=0 status=ok
  shift
  if ((left < 10)); then record "$name" skipped 0 "no time left in the ${BUDGET} s budget"; return 1; fi
  ((box > left)) && box=$left
  echo "=== $name (time box $box s): $*" | tee -a "$LOG"
  timeout --kill-after=10 "$box" "$@" >>"$LOG" 2>&1 || rc=$?
  ((rc == 124 || rc == 137)) && status=timeout
  ((rc != 0)) && [[ $status == ok ]] && status=failed
  record "$name" "$status" $((SECONDS - t0)) "exit $rc"
  [[ $status == ok ]]
}

skip() { record "$1" skipped 0 "$2"; }

install_project() {  # device: carried wheels (to $WORK/site) and the project (editable, no index); both: check imports
  if ((!DRY)); then
    if [[ -n $WHEELS ]]; then
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
        "$WHEELS"/*.whl || return 1
    fi
    PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}" \
      "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . || return 1
  fi
  PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$DEVICE" "$WORK/env.json" <<'EOF'
import json, pathlib, sys
import fastapi, torch, transformers, uvicorn
import gleanrl.server
device, out = sys.argv[1], sys.argv[2]
root = pathlib.Path.cwd().resolve()
if root not in pathlib.Path(gleanrl.server.__file__).resolve().parents:
    sys.exit(f"gleanrl imports from {gleanrl.server.__file__}, not from this checkout {root}")
env = {"torch": torch.__version__, "transformers": transformers.__version__, "fastapi": fastapi.__version__,
       "cuda_available": torch.cuda.is_available(),
       "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
pathlib.Path(out).write_text(json.dumps(env))
print(env)
if device == "cuda" and not env["cuda_available"]:
    sys.exit("torch sees no GPU")
EOF
}

has_flag() { "$PY" -m gleanrl bench rollout --help 2>/dev/null | grep -qE -- "(^|[ ,])$1([ ,=]|$)"; }

echo "gpu_check: device $DEVICE, budget $BUDGET s, python $PY, out $OUT_DIR, work $WORK" | tee "$LOG"
export -f install_project && export DRY DEVICE PY WHEELS WORK  # `timeout` runs a new bash for it
if phase install bash -c install_project; then
  export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
  GL=("$PY" -m gleanrl)
  phase tests env GLEANRL_TEST_DEVICE="$DEVICE" "$PY" -m pytest -q -p no:cacheprovider -rs -m cuda tests/cuda \
    --junitxml "$OUT_DIR/tests.xml"
  POLICY=""
  if phase bootstrap "${GL[@]}" bootstrap --size "$SIZE" --device "$DEVICE"; then
    POLICY=$(awk '/^policy: /{print $2}' "$LOG" | tail -1)
  fi
  DRAFTER=$WORK/drafter
  if [[ -z $POLICY ]]; then
    for p in draft sd rollout e2e; do skip "$p" "needs the bootstrap policy"; done
  elif phase draft "${GL[@]}" draft train --model "$POLICY" --task doubling --out "$DRAFTER" --device "$DEVICE" \
      --log "$WORK/draft.jsonl" "${DRAFT_ARGS[@]}"; then
    phase sd "${GL[@]}" bench sd --model "$POLICY" --drafter "$DRAFTER" --device "$DEVICE" \
      --json "$OUT_DIR/sd.json" "${SD_ARGS[@]}"
    if "$PY" -m gleanrl bench rollout --help >/dev/null 2>&1; then
      args=(--json "$OUT_DIR/rollout.json")
      for f in model:"$POLICY" drafter:"$DRAFTER" device:"$DEVICE"; do
        has_flag "--${f%%:*}" && args+=("--${f%%:*}" "${f#*:}")
      done
      phase rollout "${GL[@]}" bench rollout "${args[@]}" "${ROLLOUT_ARGS[@]}"
    else
      record rollout absent 0 "this checkout has no gleanrl bench rollout"
    fi
    rm -rf "$WORK/e2e"
    phase e2e "${GL[@]}" bench e2e --model "$POLICY" --drafter "$DRAFTER" --device "$DEVICE" --out "$WORK/e2e" \
      --json "$OUT_DIR/e2e.json" "${E2E_ARGS[@]}"
  else
    for p in sd rollout e2e; do skip "$p" "needs the warm-started drafter"; done
  fi
else
  for p in tests bootstrap draft sd rollout e2e; do skip "$p" "needs the install"; done
fi

"$PY" - "$PHASES" "$OUT_DIR" "$WORK" "$DRY" "$BUDGET" $((SECONDS - START)) <<'EOF' || exit 1
import json, pathlib, sys
import xml.etree.ElementTree as ET
phases_file, out, work, dry, budget, seconds = sys.argv[1:]
out, work = pathlib.Path(out), pathlib.Path(work)
phases = {}
for line in pathlib.Path(phases_file).read_text().splitlines():
    name, status, secs, detail = line.split("\t")
    phases[name] = {"status": status, "seconds": int(secs), "detail": detail}
def read(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
results = {name: read(out / f"{name}.json") for name in ("sd", "rollout", "e2e")}
if (out / "tests.xml").is_file():
    suite = ET.parse(out / "tests.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    results["tests"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
summary = {"dry_run": dry == "1", "budget_s": int(budget), "seconds": int(seconds), "env": read(work / "env.json"),
           "phases": phases, "ok": all(p["status"] in ("ok", "absent") for p in phases.values()), "results": results}
(out / "summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps({k: summary[k] for k in ("ok", "seconds", "phases")}, indent=1))
sys.exit(0 if summary["ok"] else 1)
EOF
