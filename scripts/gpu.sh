#!/usr/bin/env bash
# What runs on the GPU machine (an H100 or H200: python3 with torch and triton, no network;
# results go to benchmarks/<gpu>/). Installs the carried wheels (.whl/: kernels, transformers,
# huggingface_hub, liger-kernel, tomlkit, tabulate and what they need) into /tmp/site, then
# runs the stages named as arguments, writing everything under $OUT:
#   release   what proves a commit on this GPU and writes its records, in one 10-minute call
#             (ROPE_COMMIT=<hash>: the machine gets the files without git), every step bounded
#             by the time left of RELEASE_BUDGET (565 s), RELEASE_RECORDS (270 s) kept for the
#             records: the tests that may touch CUDA (ROPE_CUDA_ONLY=1: tests/conftest.py; CI runs
#             the rest) on XDIST workers (15), beside them each record once unmeasured (to fill the
#             compile caches), then the whole_gpu tests alone, then the records,
#             tuned and, where the GPU has a tuned table, --untuned: the suite preset's 16 public
#             workloads, realcall, decoder, decode. $OUT gets tests.log, tests-big.log,
#             release.log, warm.tar.gz (the unmeasured runs' logs) and <gpu>.tar.gz (release.json; bench, realcall, decoder, decode, families and their
#             -untuned twins, each as json, md and png), each as soon as its step ends; the last
#             line sums up. Unpack the tar into benchmarks/, then `python -m rope_bwd_triton results`
#             writes RESULTS.md's section of that GPU and the README's performance table from it
#   tests     the whole pytest suite (GPU tests included, and refused to skip: tests/skips.py;
#             PYTEST_ARGS narrows it)
#   tests-shard  shard SHARD=k/n of the suite (a hash of each test's id: tests/conftest.py) but
#             the whole_gpu tests, on XDIST workers (default 14); each of 3 shards fits one
#             10-minute call: for k in 1 2 3: SHARD=$k/3 bash scripts/gpu.sh tests-shard
#   tests-big the whole_gpu tests (2^31 elements: up to 54 GB), one process, no other workers,
#             so that they fit an 80 GB H100: bash scripts/gpu.sh tests-big
#   bench     the suite preset: the 16 public workloads, then S = 16384 / 65536 and head_dim
#             72 / 80, in one process (one copy-bandwidth figure for all)
#   realcall  the real model's call (views of qkv, sdpa's and flash-attention's gradient
#             layouts) against a copy of its bytes and the peers (REALCALL_ARGS)
#   decoder   the decoders' call (Llama-3-8B's and Qwen3-Omni's Thinker's heads, views of the q/k
#             projections, sdpa's gradient, B 1 and 4, S 2048 to 32768) against a copy of its bytes
#             and the peers, transformers, torch.compile and Liger-Kernel (DECODER_ARGS)
#   decode    those heads' call in a generation step, forward only under no grad (S = 1 at B 1, 8,
#             64; a prefill at B 1, S 2048): GPU and wall time per call against transformers and
#             torch.compile (DECODE_ARGS)
#   UNTUNED=1 makes every bench stage measure default_config where the GPU has a tuned table
#             (bench --untuned; outputs named <stage>-untuned), e.g. UNTUNED=1 bash scripts/gpu.sh decode
#   copybound ours against the best plain Triton copy of each task's bytes on the suite
#   ab        this tree against other builds in one process (AB="<checkouts with build/>", default
#             .ab/base): the 16 public workloads, and the real call at S = 1024/4096/16384
#   e2e       Qwen3-Omni vision-encoder training step: eager, kernelized, bound
#             (E2E_ARGS, default --rounds 10 --iters 50 --profile: traces under $OUT)
#   e2e-decoder  a Llama decoder's training step at Llama-3-8B's width: eager, kernelized, bound
#             (E2E_DECODER_ARGS, default --layers 2 --tokens 2048 8192 --rounds 10 --iters 50)
#   varres    training on images of varying resolution (e2e --varres), fresh processes (VARRES_ARGS,
#             e.g. "--family qwen2_5_vl --depth 8")
#   overhead  first calls in fresh processes with empty caches, and host time per call with the
#             fast launch on and off (OVERHEAD_ARGS)
#   tune      search launch configurations -> this Triton's table in torch-ext/rope_bwd/configs/<GPU>.json
#   memcheck  GPU tests under compute-sanitizer's memcheck, one process, torch's caching
#             allocator off so that an access past a tensor is past its allocation (PYTEST_ARGS,
#             default the CUDA tests of test_ops and test_gpu_hardening but the 2^31-element one and
#             those that need the caching allocator: CUDA graphs, allocation counts);
#             MEMCHECK_ARGS adds sanitizer options, e.g. --kernel-name kns=rotary to check only
#             our kernels, so that an over-read in a library kernel does not end the run
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  [ -f /tmp/site/.installed ] || {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
      touch /tmp/site/.installed; } || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
run_bench() {  # run_bench <preset> <name of its outputs under $OUT> [more bench options]
  local name=$2${UNTUNED:+-untuned}
  python3 -m rope_bwd_triton bench --preset "$1" "${@:3}" ${UNTUNED:+--untuned} --json "$OUT/$name.json" \
    --markdown "$OUT/$name.md" --plot "$OUT/$name.png"
}
run_tests() {  # run_tests <log name under $OUT> [pytest options]
  ROPE_EXPECT_CUDA=1 python3 -m pytest -q -rs -p no:cacheprovider "${@:2}" 2>&1 | tee "$OUT/$1" | tail -40
}
release() {  # the release stage (header); its own log, summary and deadline
  local t0=$SECONDS budget=${RELEASE_BUDGET:-565} reserve=${RELEASE_RECORDS:-270} gpu table records=/tmp/release
  left() {  # left <cap> [reserve]: seconds for a step, at most cap, keeping reserve for later steps
    local l=$((budget - (SECONDS - t0) - ${2:-0}))
    echo $(($1 < l ? $1 : (l > 1 ? l : 1)))
  }
  export ROPE_COMMIT=${ROPE_COMMIT:-$(python3 -c "from rope_bwd_triton.output import commit; print(commit() or 'unknown')")}
  # inductor compiles in this process: no worker pool to start, nor to wait for at exit
  export TORCHINDUCTOR_COMPILE_THREADS=1
  read -r gpu table < <(python3 -c "import torch; n = torch.cuda.get_device_name(); \
print(n.split()[1].lower() if n.startswith('NVIDIA ') else n.replace(' ', '_').lower(), n.replace(' ', '_').replace('/', '_'))")
  rm -rf $records /tmp/warm && mkdir -p "$records/$gpu" /tmp/warm && cp "$OUT/gpu.txt" "$records/$gpu/"
  echo "release of $ROPE_COMMIT on $gpu ($(python3 -m rope_bwd_triton build 2>&1 | sed -n 1p))"
  local runs=(  # name, seconds at most, bench arguments
    "bench 45 --preset suite --set suite --tasks bwd,bwd_bf16 --peers copy"
    "realcall 90 --preset realcall --seq-lens 256 4096 65536 --head-dims 72 128 --peers copy,compile,liger"
    "decoder 45 --preset decoder --seq-lens 2048 8192 --batches 1 --peers copy,compile,liger,transformers"
    "decode 50 --preset decode"
    "families 45 --preset families --peers copy,compile"
  )
  if [ -f "torch-ext/rope_bwd/configs/$table.json" ]; then  # default_config against the table, a copy beside it
    runs+=("bench-untuned 25 --preset suite --set suite --tasks bwd,bwd_bf16 --peers copy --untuned"
      "realcall-untuned 25 --preset realcall --seq-lens 256 4096 65536 --head-dims 72 128 --peers copy --untuned"
      "decoder-untuned 20 --preset decoder --seq-lens 2048 8192 --batches 1 --peers copy --untuned"
      "decode-untuned 20 --preset decode --peers= --untuned")
  fi
  local run name cap kept=()
  for name in ${RELEASE_ONLY:-}; do  # RELEASE_ONLY="families bench": those records alone, in that order
    for run in "${runs[@]}"; do [[ $run == "$name "* ]] && kept+=("$run"); done
  done
  [ -n "${RELEASE_ONLY:-}" ] && runs=("${kept[@]}")
  # Beside the tests, every record once at 3 calls, unmeasured and niced: Triton's and inductor's
  # on-disk caches then hold their kernels, and the measured runs below do not compile.
  for run in "${runs[@]}"; do
    read -r name cap args <<<"$run"
    # shellcheck disable=SC2086  # the arguments are words
    [[ $args == *"--preset suite"* ]] && args+=" --copy-mib 64"  # that preset's copy peer: a smaller buffer
    nice -n 10 timeout -k 5 "$(left 240 "$reserve")" python3 -m rope_bwd_triton bench $args --calls 3 --rounds 1 \
      --json "/tmp/warm/$name.json" --markdown "/tmp/warm/$name.md" --plot "/tmp/warm/$name.png" \
      >"/tmp/warm/$name.log" 2>&1 &
  done
  # -v: each test's outcome as it ends; SIGINT at the deadline: pytest still prints its failures
  ROPE_EXPECT_CUDA=1 ROPE_CUDA_ONLY=1 timeout -s INT -k 20 "$(left 600 $((reserve + 40)))" python3 -m pytest -v -rfEs \
    --tb=short -p no:cacheprovider --durations=30 -n "${XDIST:-15}" -m "not whole_gpu" >"$OUT/tests.log" 2>&1
  local tests_rc=$?
  echo "tests: exit $tests_rc at $((SECONDS - t0)) s: $(tail -1 "$OUT/tests.log")"
  grep -E "^\[gw[0-9]+\] .*(FAILED|ERROR) " "$OUT/tests.log" | sed 's/^\[gw[0-9]*\] \[ *[0-9]*%\] //' | sort -u
  wait
  echo "warm-up runs done at $((SECONDS - t0)) s: $(grep -L "^wrote " /tmp/warm/*.log | xargs -r -n1 basename | tr '\n' ' ')"
  ROPE_EXPECT_CUDA=1 ROPE_CUDA_ONLY=1 timeout -s INT -k 10 "$(left 60 "$reserve")" python3 -m pytest -v -rfEs --tb=short \
    -p no:cacheprovider -p no:xdist -m whole_gpu >"$OUT/tests-big.log" 2>&1
  local big_rc=$?
  echo "whole_gpu tests: exit $big_rc at $((SECONDS - t0)) s: $(tail -1 "$OUT/tests-big.log")"
  for run in "${runs[@]}"; do
    read -r name cap args <<<"$run"
    # shellcheck disable=SC2086  # the arguments are words
    timeout -k 10 "$(left "$cap")" python3 -m rope_bwd_triton bench $args --json "$records/$gpu/$name.json" \
      --markdown "$records/$gpu/$name.md" --plot "$records/$gpu/$name.png" 2>&1 | tr '\r' '\n' | grep -v "run/s" | tail -3
    echo "$name: exit ${PIPESTATUS[0]} at $((SECONDS - t0)) s"
    tar czf "$OUT/.records.tmp" -C $records "$gpu" && mv "$OUT/.records.tmp" "$OUT/$gpu.tar.gz"
  done
  python3 -m rope_bwd_triton results --release "$records/$gpu" --tests "$OUT/tests.log" "$tests_rc" \
    --big "$OUT/tests-big.log" "$big_rc" --seconds $((SECONDS - t0)) --records "${#runs[@]}"
  local status=$?
  tar czf "$OUT/.records.tmp" -C $records "$gpu" && mv "$OUT/.records.tmp" "$OUT/$gpu.tar.gz"
  tar czf "$OUT/warm.tar.gz" -C /tmp/warm .  # one file: a call brings back 8 at most
  return $status
}
rc=0
for stage in "$@"; do
  echo "=== $stage"
  case $stage in
    release)  release 2>&1 | tee "$OUT/release.log" ;;
    tests)    run_tests pytest.log ${PYTEST_ARGS:-} ;;
    tests-shard) ROPE_SHARD=${SHARD:?SHARD=k/n} run_tests "pytest-shard-${SHARD/\//-of-}.log" -n "${XDIST:-14}" \
                -m "not whole_gpu" ;;
    tests-big) run_tests pytest-big.log -p no:xdist -m whole_gpu ;;
    bench)    run_bench suite bench ;;
    realcall) run_bench realcall realcall ${REALCALL_ARGS:-} ;;
    decoder)  run_bench decoder decoder ${DECODER_ARGS:-} ;;
    decode)   run_bench decode decode ${DECODE_ARGS:-} ;;
    copybound) run_bench copybound copybound ;;
    ab)       run_bench suite ab-suite --set suite --peers "" --ab ${AB:-.ab/base} | tail -30 &&
              run_bench realcall ab-realcall --seq-lens 1024 4096 16384 --peers copy --ab ${AB:-.ab/base} ;;
    e2e)      python3 -m rope_bwd_triton publish --to-cache /tmp/kc >/dev/null &&
              HF_HUB_OFFLINE=1 KERNELS_CACHE=/tmp/kc python3 -m rope_bwd_triton e2e ${E2E_ARGS:---rounds 10 --iters 50 --profile} --out "$OUT" ;;
    e2e-decoder) python3 -m rope_bwd_triton publish --to-cache /tmp/kc >/dev/null &&
              HF_HUB_OFFLINE=1 KERNELS_CACHE=/tmp/kc python3 -m rope_bwd_triton e2e --decoder \
                ${E2E_DECODER_ARGS:---layers 2 --tokens 2048 8192 --rounds 10 --iters 50} --out "$OUT" ;;
    varres)   python3 -m rope_bwd_triton publish --to-cache /tmp/kc >/dev/null &&
              HF_HUB_OFFLINE=1 KERNELS_CACHE=/tmp/kc python3 -m rope_bwd_triton e2e --varres ${VARRES_ARGS:-} --out "$OUT" ;;
    overhead) python3 -m rope_bwd_triton overhead --profile ${OVERHEAD_ARGS:-} --json "$OUT/overhead.json" ;;
    tune)     python3 -m rope_bwd_triton tune --budget "${TUNE_BUDGET:-240}" ${TUNE_ARGS:-} --log "$OUT/tune.json" &&
              cp torch-ext/rope_bwd/configs/*.json "$OUT/" ;;
    memcheck) PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --report-api-errors no \
                --error-exitcode 9 --print-limit 100 ${MEMCHECK_ARGS:-} \
                python3 -m pytest -q -p no:cacheprovider -p no:xdist ${PYTEST_ARGS:-tests/test_ops.py \
                tests/test_gpu_hardening.py -k "(cuda or not cpu) and not past_2_31 and not cuda_graph and not allocates_only"} \
                2>&1 | tee "$OUT/memcheck.log" | tail -30 ;;
    *) echo "unknown stage $stage"; rc=2 ;;
  esac
  [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
done
exit $rc
