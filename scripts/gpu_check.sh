#!/usr/bin/env bash
# GPU check: install (no network), run the GPU tests, the correctness gate and sweeps,
# and leave logs, CSVs and plots under an output folder.
#
#   scripts/gpu_check.sh [OUT_DIR] [STEP ...]
#   steps: tests check example compare seed llm (default: tests check seed)
#   check: the gate for our own families (CHECK_ARGS overrides; the peers' gate is in the tests)
#   example: the README's `attnbench run` example
#   seedwarm: the seed sweep once more, after `seed`, for its wall time with warm kernel caches
#   compare: the seeds' comparison, naive dense vs naive streaming (16+64) for T = 128..4096
#   profile: Nsight Compute (--set full) on one launch per case of PROFILE_CASES (';'-separated
#            option lists of `attnbench profile`, e.g. "--pattern window --window 256;--pattern dense
#            --D 128"): every section, and the SASS with counters (profile_N.sass.csv, summed by
#            scripts/sass_stalls.py into profile_N.stalls.txt); PROFILE_COUNT launches (default 1; a
#            backward, `--pass bwd`, makes up to four) with ncu's section set PROFILE_SET (default full;
#            basic: the duration and throughputs of each launch, quickly) and clocks PROFILE_CLOCK (default
#            base, ncu's; none: as the sweep runs them)
#   shapes: fast-tc tile shapes against each other and the shape it chooses, interleaved, 20 samples
#           (`attnbench sweep --config llm --impl fast-tc --tile-config S ... --samples 20`, one
#           --tile-config per space-separated entry of SHAPES, e.g. SHAPES="BN=32,STAGES=3 4,64,2,1,4,0,1,1";
#           SHAPES_ARGS narrows the sweep instead of the default --T 32768, e.g. "--pattern dense --T 16384
#           --D 64 --impl sdpa-flash"), rows in shapes.csv
#   dev: fast-tc against Flex and SDPA at T=32768, interleaved, 25 samples (`attnbench sweep --config llm
#        --T 32768 --impl fast-tc --impl flex --impl sdpa-flash --impl sdpa-cudnn --samples 25`; DEV_ARGS
#        adds options, e.g. --pattern dense), rows in dev.csv
#   floor: what the timing protocol measures for launches that do next to nothing (`attnbench floor`),
#        floor.csv
#   tilebuild: tile-list build times at T=131072, host and device (`attnbench tiles`; TILES_ARGS adds
#        options, e.g. --T 32768), tile_build.csv
#   gqa: fast-tc and fast-tc-sync with grouped-query heads against H_kv = H, the llm configuration at
#        T=32768 (GQA_ARGS replaces that), sdpa-cudnn and flex beside them (GQA_IMPLS replaces the
#        four --impl options), 25 samples: `--H-kv 16` (H)
#        then `--H-kv 4`, rows of both in OUT_DIR/gqa.csv as they come (resumable; the issue's target: as
#        many useful TFLOP/s at H_kv=4)
#   decode: `attnbench sweep --config decode` (DECODE_ARGS adds options, e.g. --impl fast-decode --B 1),
#           rows in decode.csv
#   decodeshapes: fast-decode's shapes against each other and SDPA on the dense and streaming 4+1024
#           decodes (Tq=1, T 4096, 32768, 131072, the decode configuration's B), interleaved, 25 samples:
#           one --decode-config per space-separated entry of DECODE_SHAPES (default below: the warps on
#           rows instead of keys, split counts, stages, key tiles), DECODESHAPES_ARGS replaces the
#           narrowing options; rows in OUT_DIR/decodeshapes.csv as they come (resumable)
#   ab: this tree against an earlier one, alternating: AB_OLD names a folder holding a checkout of the
#       earlier commit (e.g. `git archive C | tar -x -C old`, carried beside the tree) and AB_OLD_COMMIT
#       its commit; AB_ROUNDS (default 3) rounds of `attnbench sweep --config $AB_CONFIG $AB_ARGS` each way
#       (AB_CONFIG: llm unless given, e.g. decode), the earlier tree's from its own folder (refused unless its
#       package imports from there), every row in ab.csv with the git_commit of the tree that ran it
#   context: whether a row's time depends on what else the sweep times: one case (CONTEXT_ARGS, e.g.
#           "--config decode --pattern dense --B 8 --T 32768 --Tq 1") for CONTEXT_IMPL (default fast-decode),
#           in three processes: alone, beside CONTEXT_PEERS (default sdpa-cudnn, interleaved as sweeps time
#           them), alone again; then the same case after CONTEXT_BEFORE's cases in the same process (default:
#           none); rows in OUT_DIR/context_{alone,with,alone2,after}.csv
#   history: which part of a sweep's earlier case moves the next one's time (scripts/history_probe.py), one process a
#           variant BEFORE:THEN of HISTORY_VARIANTS, HISTORY_ROUNDS rounds (default 2), HISTORY_ARGS adds the probe's
#           options; rows appended to OUT_DIR/history.csv
#   placement: one decode case's inputs at other places in device memory, in one process: first, behind kept pads,
#           after a B=1 case, K and V handed over the other way round; the implementation's time beside one read of K
#           and of V (scripts/placement_probe.py; PLACEMENT_ARGS replaces its options, default "--pattern dense --B 8
#           --T 32768 --Tq 1"), rows in OUT_DIR/placement.csv
#   sanitizer: compute-sanitizer's tools on the kernels (tests/test_sanitizer_gpu.py), one pytest run a tool
#           (SANITIZER_TOOLS, default "memcheck racecheck"), each a step of its own so that a run cut short by a
#           time limit keeps the verdicts of the tools it finished; SANITIZER_K narrows the tests beside the tool
#           (default: backward; e.g. "fast_decode"). On a fresh machine the first tool also compiles every build
#           it runs (the backward's memcheck: about 6 minutes on an H100, racecheck after it about 2)
#   traincheck: `attnbench check --pass bwd` (the gradient gate) on every implementation that runs here,
#           small cases (TRAINCHECK_ARGS replaces them)
#   train: `attnbench sweep --config training` (fwd, bwd, fwd+bwd) for fast-tc and the peers, 10 samples,
#          T=32768 (TRAIN_ARGS replaces that, e.g. "--T 4096 --D 64"; TRAIN_IMPLS the implementations,
#          e.g. "fast-tc flex"), rows in OUT_DIR/train.csv (TRAIN_CSV names another) as they come; with
#          GPUS=N, N processes (`--shard i/N`, one GPU each) write OUT_DIR/train.shard-i.csv, merged into
#          train.csv at the end; TRAIN_FROM names a folder of an earlier run's CSVs to resume
#   overlap: fast-tc's overlapped walk (kernels/tc/loop_overlap.cuh, on sm_90 the default of D=128 rows of 512 keys or
#          more), its stages released by the warps (REL=1, kernels/tc/load_released.cuh, the default of the long D=128
#          shape) and K and V on stages of their own (KVS=1, kernels/tc/load_split.cuh): their GPU gate and
#          compute-sanitizer tests, then fast-tc's default against the serial walk (--tile-config OV=0), OV=1,REL=1,
#          OV=1,REL=1,KVS=1 and SDPA cuDNN, interleaved, 20 samples, on the llm configuration's dense, window, document
#          and streaming instances at T=32768, D=128 (OVERLAP_ARGS replaces those options), rows in OUT_DIR/overlap.csv
#          as they come
#   classes: fast-tc-classes (the class-major layout): its GPU tests (tests/test_classes.py), then the training
#          configuration's dilated instances with fast-tc, fast-tc-classes and Flex in one process, every pass,
#          10 samples (CLASSES_ARGS replaces the default --T 32768), rows in OUT_DIR/classes.csv as they come
#
# GPU_TESTS (optional) narrows the tests step to given files or one-word -k expressions, split at spaces (the
# whole GPU suite takes about 6 minutes on a warm H100, more on a fresh machine: split it over calls under a
# 10-minute limit, e.g. tests/test_fast_tc.py tests/test_predicate.py, then the rest); GPU_TESTS_K (optional) is
# one -k expression passed whole, spaces and all (e.g. "heads or gate_ragged"); LLM_FROM and
# LLM_ARGS (optional) resume and narrow the llm sweep, so it can be spread over several runs.
# OUT_DIR defaults to $OUT, else ./out. Everything is also packed into OUT_DIR/gpu_check.tar.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-out}}"; shift || true
steps="${*:-tests check seed}"
work="$(mktemp -d)"
mkdir -p "$out"
log="$work/gpu_check.log"
export PYTHONUNBUFFERED=1
status=0
say() { echo "== $*" | tee -a "$log"; }
step() {  # step NAME CMD...: run, log, remember failure, go on
    local name="$1"; shift
    say "$name: $*"
    local t0=$(date +%s)
    # (also appended to OUT_DIR/steps.log as it runs, so a step cut short by a time limit still says where it was)
    "$@" > >(tee "$work/$name.log" >>"$out/steps.log") 2>&1
    local rc=$?
    say "$name: exit $rc after $(( $(date +%s) - t0 )) s"
    [ $rc -eq 0 ] || status=1
    pack
}
sharded() {  # sharded NAME CSV CMD...: CMD on each of $GPUS GPUs at once (shard i of GPUS, --resume,
    # rows in CSV.shard-i.csv, logs in OUT_DIR/NAME_i.log), then the shards merged into CSV; one GPU: a step.
    # GPU_FROM: the first GPU's index (default 0), so another run can have the ones below it
    local name="$1" csv="$2"; shift 2
    local n="${GPUS:-1}"
    if [ "$n" -le 1 ]; then step "$name" "$@" --resume --out "$csv"; return; fi
    say "$name: $* on $n GPUs"
    local t0=$(date +%s) pids=() i rc
    for i in $(seq 1 "$n"); do
        CUDA_VISIBLE_DEVICES=$((i - 1 + ${GPU_FROM:-0})) "$@" --shard "$i/$n" --resume --out "${csv%.csv}.shard-$i.csv" \
            > "$out/${name}_$i.log" 2>&1 &
        pids+=($!)
    done
    for i in $(seq 1 "$n"); do
        wait "${pids[$((i - 1))]}"; rc=$?
        say "$name shard $i/$n: exit $rc after $(( $(date +%s) - t0 )) s"
        [ $rc -eq 0 ] || status=1
    done
    step "${name}_merge" attnbench merge "${csv%.csv}".shard-*.csv --out "$csv"
}
pack() {  # after every step, so a run cut short still leaves what it finished
    tar -cf "$out/gpu_check.tar" -C "$work" . 2>/dev/null
    cp "$log" "$out/"
    for f in "$work"/*.csv "$work"/*.txt; do [ -e "$f" ] && cp "$f" "$out/"; done
}

# provenance: the commit the rows name (scripts/provenance.sh: ATTNBENCH_GIT_COMMIT when set, else git, else .provenance)
commit="$(bash scripts/provenance.sh)"  # (run from the repository root, as every step is)
export ATTNBENCH_GIT_COMMIT="$commit"
say "attnbench gpu_check $commit steps: $steps"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$work/install.log" 2>&1 \
    || { cat "$work/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee -a "$log"
python3 -c "import cupy, sys; print('cupy', cupy.__version__, 'cuda runtime', cupy.cuda.runtime.runtimeGetVersion(), 'python', sys.version.split()[0])" | tee -a "$log"

for s in $steps; do
    case "$s" in
    tests) step tests python3 -m pytest -q -m gpu -rs --junitxml="$work/pytest_gpu.xml" ${GPU_TESTS:-} \
               ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} ;;
    check) step check attnbench check ${CHECK_ARGS:---impl naive --impl fast-f32 --impl fast-tc --impl fast-tc-sync} ;;
    example) step example attnbench run --pattern streaming --T 2048 --window 128 --sink 32 ;;
    compare) for T in 128 256 512 1024 2048 4096; do step compare_$T attnbench run --pattern streaming --T $T; done ;;
    seed)  step seed attnbench sweep --T-min 128 --T-max 4096 --out "$work/seed.csv"
           step seed_plot attnbench plot "$work/seed.csv" --out-dir "$work/plots" ;;
    seedwarm) # the same sweep again: its wall time with the kernel caches warm
           step seedwarm attnbench sweep --T-min 128 --T-max 4096 --out "$work/seed-warm.csv" ;;
    llm)   # LLM_FROM: a CSV of an earlier run to resume; LLM_ARGS: options that narrow the sweep
           # (written straight into OUT_DIR, so the rows of a run cut short come back)
           if [ -n "${LLM_FROM:-}" ] && [ -f "$LLM_FROM" ]; then cp "$LLM_FROM" "$out/llm.csv"; fi
           # LLM_ARGS: ';' separates sweeps that go into the same CSV
           IFS=';' read -ra groups <<< "${LLM_ARGS:- }"
           for g in "${groups[@]}"; do step llm attnbench sweep --config llm $g --resume --out "$out/llm.csv"; done
           step llm_plot attnbench plot "$out/llm.csv" --out-dir "$work/plots" ;;
    profile) IFS=';' read -ra cases <<< "${PROFILE_CASES:---impl fast-tc --pattern streaming --sink 16 --window 64}"
           n=0
           for c in "${cases[@]}"; do
               n=$((n + 1))
               # the one launch `attnbench profile` makes inside its NVTX range profile/<impl>
               step profile_$n ncu --nvtx --nvtx-include "profile/" --launch-count "${PROFILE_COUNT:-1}" \
                   --set "${PROFILE_SET:-full}" --clock-control "${PROFILE_CLOCK:-base}" \
                   --import-source no -f -o "$work/profile_$n" attnbench profile $c
               # the report as text: every section, then the SASS with per-instruction counters
               ncu -i "$work/profile_$n.ncu-rep" --page details > "$work/profile_$n.txt" 2>&1
               ncu -i "$work/profile_$n.ncu-rep" --page source --print-source sass --csv > "$work/profile_$n.sass.csv" 2>&1
               # where each launch's warps wait, summed from that CSV (scripts/sass_stalls.py)
               python3 scripts/sass_stalls.py "$work/profile_$n.sass.csv" > "$work/profile_$n.stalls.txt" 2>&1
               rm -f "$work/profile_$n.ncu-rep"
               pack
           done ;;
    shapes) tile=()
           for s in ${SHAPES:?SHAPES names the tile shapes (--tile-config values, space-separated)}; do
               tile+=(--tile-config "$s")
           done
           step shapes attnbench sweep --config llm --impl fast-tc "${tile[@]}" --samples 20 \
               ${SHAPES_ARGS:---T 32768} --out "$work/shapes.csv" ;;
    dev) step dev attnbench sweep --config llm --T 32768 --impl fast-tc --impl flex --impl sdpa-flash \
               --impl sdpa-cudnn --samples 25 ${DEV_ARGS:-} --out "$work/dev.csv" ;;
    floor) step floor attnbench floor --out "$work/floor.csv" ;;
    tilebuild) step tilebuild attnbench tiles ${TILES_ARGS:-} --out "$work/tile_build.csv" ;;
    gqa)   for hkv in 16 4; do
               step gqa_$hkv attnbench sweep --config llm --H-kv $hkv \
                   ${GQA_IMPLS:---impl fast-tc --impl fast-tc-sync --impl sdpa-cudnn --impl flex} \
                   --samples 25 ${GQA_ARGS:---T 32768} --resume --out "$out/gqa.csv"
           done ;;
    decode) # the serving configuration (DECODE_ARGS narrows it), rows in OUT_DIR/decode.csv as they come
           step decode attnbench sweep --config decode ${DECODE_ARGS:-} --resume --out "$out/decode.csv" ;;
    decodeshapes) dc=()
           for s in ${DECODE_SHAPES:-BY_KEYS=0 SPLITS=8 SPLITS=16 STAGES=2 STAGES=4 STAGES=2,MINB=3 BN=128,STAGES=2 BY_KEYS=0,SPLITS=16}; do
               dc+=(--decode-config "$s")
           done
           step decodeshapes attnbench sweep --config decode --impl fast-decode "${dc[@]}" --impl sdpa-cudnn \
               --impl sdpa-flash --samples 25 ${DECODESHAPES_ARGS:---pattern dense --pattern streaming --sink 4 --window 1024 --Tq 1 --T 4096 --T 32768 --T 131072} \
               --resume --out "$out/decodeshapes.csv" ;;
    ab)    old="$(cd "${AB_OLD:?AB_OLD names the earlier tree}" && pwd)" || { status=1; continue; }
           mkdir -p "$work/ab"  # the rounds' CSVs stay in the tar (a device call brings back few files)
           # the earlier tree's package, run from its own directory: python -m puts the working directory first on
           # the path, ahead of PYTHONPATH, so run from this tree it imported this tree's package (every A/B of this
           # step before the fix compared this tree with itself: docs/PERF.md "The ab step ran one tree twice")
           ab_old() { (cd "$old" && PYTHONPATH="$old" ATTNBENCH_GIT_COMMIT="${AB_OLD_COMMIT:-old}" python3 "$@"); }
           if ! ab_old -c 'import attnbench, os, sys; p = os.path.dirname(os.path.realpath(attnbench.__file__))
sys.exit(0 if p.startswith(os.getcwd()) else f"ab: attnbench comes from {p}, not the earlier tree")'; then
               say "ab: the earlier tree's package does not import from $old"; status=1; continue
           fi
           for r in $(seq 1 "${AB_ROUNDS:-3}"); do
               step ab_new_$r attnbench sweep --config "${AB_CONFIG:-llm}" ${AB_ARGS:-} --out "$work/ab/new_$r.csv"
               step ab_old_$r ab_old -m attnbench.cli sweep --config "${AB_CONFIG:-llm}" ${AB_ARGS:-} \
                   --out "$work/ab/old_$r.csv"
           done
           python3 - "$work" <<'PY' && pack
import glob, sys, pandas as pd
w = sys.argv[1]
pd.concat([pd.read_csv(f) for f in sorted(glob.glob(f"{w}/ab/*_*.csv"))]).to_csv(f"{w}/ab.csv", index=False)
PY
           ;;
    context) ca="${CONTEXT_ARGS:?CONTEXT_ARGS names one case (sweep options)}"
           ci="${CONTEXT_IMPL:-fast-decode}"
           cp_=(); for i in ${CONTEXT_PEERS:-sdpa-cudnn}; do cp_+=(--impl "$i"); done
           step context_alone attnbench sweep $ca --impl "$ci" --out "$out/context_alone.csv"
           step context_with attnbench sweep $ca --impl "$ci" "${cp_[@]}" --out "$out/context_with.csv"
           step context_alone2 attnbench sweep $ca --impl "$ci" --out "$out/context_alone2.csv"
           if [ -n "${CONTEXT_BEFORE:-}" ]; then
               step context_after attnbench sweep $ca $CONTEXT_BEFORE --impl "$ci" --out "$out/context_after.csv"
           fi ;;
    history) for r in $(seq 1 "${HISTORY_ROUNDS:-2}"); do
               for v in ${HISTORY_VARIANTS:-none:sweep sweep:sweep sweep-nometer:sweep gate:sweep time:sweep prepare:sweep sweep:probe none:probe}; do
                   step history_${r}_${v/:/_} python3 scripts/history_probe.py --before "${v%%:*}" --then "${v##*:}" \
                       ${HISTORY_ARGS:-} --out "$out/history.csv"
               done
           done ;;
    placement) step placement python3 scripts/placement_probe.py ${PLACEMENT_ARGS:---pattern dense --B 8 --T 32768 --Tq 1} \
               --out "$out/placement.csv" ;;
    sanitizer) if ! command -v compute-sanitizer >/dev/null; then  # the tests would skip: no verdict, a failed step
               say "sanitizer: compute-sanitizer not on PATH"; status=1; continue
           fi
           for tool in ${SANITIZER_TOOLS:-memcheck racecheck}; do
               step sanitizer_$tool python3 -m pytest -q -m gpu -rs tests/test_sanitizer_gpu.py \
                   -k "${SANITIZER_K:-backward} and $tool"
           done ;;
    traincheck) # the gradient gate of every peer that runs here, bfloat16, D=64 (TRAINCHECK_ARGS overrides)
           step traincheck attnbench check --pass bwd ${TRAINCHECK_ARGS:---T 7 --T 1000 --H 2 --pattern dense --pattern window --pattern streaming --pattern block_diagonal} ;;
    train) # the training configuration's passes (TRAIN_ARGS narrows it, default T=32768), rows in
           # OUT_DIR/train.csv as they come
           # TRAIN_IMPLS (space-separated) replaces the implementations, TRAIN_CSV the file name
           # GPUS=N: one shard a GPU; TRAIN_FROM: a folder holding the CSVs of an earlier run to resume
           ti=(); for i in ${TRAIN_IMPLS:-fast-tc flex sdpa-flash sdpa-cudnn sdpa-efficient cublas}; do ti+=(--impl "$i"); done
           if [ -n "${TRAIN_FROM:-}" ] && [ -d "$TRAIN_FROM" ]; then cp "$TRAIN_FROM"/*.csv "$out/" 2>/dev/null; fi
           sharded train "$out/${TRAIN_CSV:-train.csv}" attnbench sweep --config training "${ti[@]}" --samples 10 \
               ${TRAIN_ARGS:---T 32768} ;;
    overlap) step overlap_tests python3 -m pytest -q -m gpu -rs tests/test_fast_tc.py tests/test_sanitizer_gpu.py \
               -k overlapped
           step overlap attnbench sweep --config llm --impl fast-tc --tile-config OV=0 --tile-config OV=1,REL=1 --tile-config OV=1,REL=1,KVS=1 --impl sdpa-cudnn \
               --samples 20 ${OVERLAP_ARGS:---T 32768 --D 128 --pattern dense --pattern window --pattern document --pattern streaming} \
               --resume --out "$out/overlap.csv" ;;
    classes) step classes_tests python3 -m pytest -q -m gpu -rs tests/test_classes.py
           step classes attnbench sweep --config training --impl fast-tc --impl fast-tc-classes --impl flex \
               --pattern dilated --samples 10 ${CLASSES_ARGS:---T 32768} --resume --out "$out/classes.csv" ;;
    *) say "unknown step $s"; status=1 ;;
    esac
done

pack
say "done: status $status, files in $out"
exit $status
