#!/usr/bin/env bash
# What runs on the H200 (the device machine: python3 with torch and triton, no
# network). Installs the carried wheels (.whl/: kernels, tomlkit, liger-kernel,
# tabulate; for kbench also sigstore and its dependencies, which the kernels CLI
# imports: `pip download --only-binary=:all: --python-version 3.12
# --platform manylinux2014_x86_64 ... "sigstore>=4,<5"`) into /tmp/site, then
# runs the stages named as arguments, writing
# everything under $OUT:
#   tune   search launch configurations -> torch-ext/rope_bwd/configs/<GPU>.json
#   bench  benchmark (docs/design.md, section 7): the 16 public workloads, then S = 16384 / 65536
#          and head_dim 72 / 80, in one process (one copy-bandwidth figure for all)
#   tests  the whole pytest suite (GPU tests included; PYTEST_ARGS narrows it)
#   ab     this tree against another build in one process (AB=<checkout with build/>, default
#          .ab/base): the 16 public workloads, and the real call at S = 1024/4096/16384
#   realcall  the real model's call (views of qkv, sdpa's and flash-attention's gradient
#          layouts) against a copy of its bytes and the peers
#   coldstart  first calls of ours and the peers, each in a fresh process with empty caches
#   varres training on images of varying resolution (e2e --varres), fresh processes
#   e2e    Qwen3-Omni vision-encoder training step: eager, kernelized, bound
#          (E2E_ARGS, default --rounds 10 --iters 50 --profile: traces under $OUT)
#   demo   the main job
#   kbench `kernels benchmark` over benchmarks/benchmark.py
#   host   host time per call of the launch path (python -m rope_bwd_triton host)
#   copybound  ours against the best plain Triton copy of each task's bytes on the suite
#          (python -m rope_bwd_triton copybound)
#   crosstriton  our kernel as another Triton compiled it (cubins of `crosstriton compile`, carried
#          in CROSS_CUBINS: folders, default .cubins/3.9) beside this machine's Triton; folders of
#          `compile --tune` write that Triton's table (copied to $OUT)
#   memcheck  GPU tests under compute-sanitizer's memcheck, one process, torch's caching
#          allocator off so that an access past a tensor is past its allocation (PYTEST_ARGS,
#          default the CUDA tests of test_ops and test_gpu_hardening but the 2^31-element one and
#          those that need the caching allocator: CUDA graphs, allocation counts);
#          MEMCHECK_ARGS adds sanitizer options, e.g. --kernel-name kns=rotary to check only
#          our kernels, so that an over-read in a library kernel does not end the run
#   attncheck  torch's attention backward on same-shape calls whose upstream gradients have
#          other strides, against float64 (ATTNCHECK_ARGS, default cuDNN's backend)
#   ncu    hardware counters of our kernel and of a streaming kernel over the same bytes
#          (python -m rope_bwd_triton ncu run under Nsight Compute, then ncu report)
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
rc=0
for stage in "$@"; do
  echo "=== $stage"
  case $stage in
    tune)  python3 -m rope_bwd_triton tune --budget "${TUNE_BUDGET:-240}" ${TUNE_ARGS:-} --log "$OUT/tune.json" && cp torch-ext/rope_bwd/configs/*.json "$OUT/" ;;
    bench) python3 -m rope_bwd_triton bench --set all --json "$OUT/bench.json" --markdown "$OUT/bench.md" --plot "$OUT/bench.png" ;;
    tests) python3 -m pytest -q -rs -p no:cacheprovider ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest.log" | tail -40 ;;
    ab)    python3 -m rope_bwd_triton bench --set suite --peers "" --ab "${AB:-.ab/base}" \
               --json "$OUT/ab-suite.json" --markdown "$OUT/ab-suite.md" --plot "$OUT/ab-suite.png" | tail -30 &&
           python3 -m rope_bwd_triton realcall --seq-lens 1024 4096 16384 --peers copy --ab ${AB:-.ab/base} \
               --json "$OUT/ab-realcall.json" --markdown "$OUT/ab-realcall.md" --plot "$OUT/ab-realcall.png" ;;
    realcall) python3 -m rope_bwd_triton realcall ${REALCALL_ARGS:-} --json "$OUT/realcall.json" \
               --markdown "$OUT/realcall.md" --plot "$OUT/realcall.png" ;;
    coldstart) python3 -m rope_bwd_triton coldstart --profile --json "$OUT/coldstart.json" ;;
    varres) python3 -m rope_bwd_triton publish --to-cache /tmp/kc >/dev/null &&
           HF_HUB_OFFLINE=1 KERNELS_CACHE=/tmp/kc python3 -m rope_bwd_triton e2e --varres ${VARRES_ARGS:-} --out "$OUT" ;;
    e2e)   python3 -m rope_bwd_triton publish --to-cache /tmp/kc >/dev/null &&
           HF_HUB_OFFLINE=1 KERNELS_CACHE=/tmp/kc python3 -m rope_bwd_triton e2e ${E2E_ARGS:---rounds 10 --iters 50 --profile} --out "$OUT" ;;
    demo)  python3 -m rope_bwd_triton demo --out "$OUT" ;;
    kbench) python3 -m rope_bwd_triton build >/dev/null && python3 -c 'import sys; from kernels.cli import main; sys.exit(main())' benchmark "$PWD" --output "$OUT/kernels-benchmark.json" ;;
    host)  python3 -m rope_bwd_triton host ${HOST_ARGS:-} | tee "$OUT/host.txt" ;;
    crosstriton) ok=0; for c in ${CROSS_CUBINS:-.cubins/3.9}; do
               python3 -m rope_bwd_triton crosstriton run "$c" --json "$OUT/crosstriton-$(basename "$c").json" || ok=1
             done; cp torch-ext/rope_bwd/configs/*.json "$OUT/"; [ $ok -eq 0 ] ;;
    copybound) python3 -m rope_bwd_triton copybound --json "$OUT/copy-bound.json" | tee "$OUT/copy-bound.txt" ;;
    memcheck) PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --report-api-errors no \
               --error-exitcode 9 --print-limit 100 ${MEMCHECK_ARGS:-} \
               python3 -m pytest -q -p no:cacheprovider -p no:xdist ${PYTEST_ARGS:-tests/test_ops.py \
               tests/test_gpu_hardening.py -k "(cuda or not cpu) and not past_2_31 and not cuda_graph and not allocates_only"} \
               2>&1 | tee "$OUT/memcheck.log" | tail -30 ;;
    attncheck) python3 -m rope_bwd_triton attncheck ${ATTNCHECK_ARGS:-} | tee "$OUT/attncheck.md" ;;
    ncu)   python3 -m rope_bwd_triton build >/dev/null &&
           ncu --clock-control none --nvtx --nvtx-include "profile/" --metrics "$(python3 -m rope_bwd_triton ncu metrics)" \
               --csv --page raw python3 -m rope_bwd_triton ncu run --labels "$OUT/ncu-labels.json" > "$OUT/ncu.csv" &&
           python3 -m rope_bwd_triton ncu report "$OUT/ncu.csv" --labels "$OUT/ncu-labels.json" --markdown "$OUT/ncu.md" ;;
    *) echo "unknown stage $stage"; rc=2 ;;
  esac
  [ ${PIPESTATUS[0]} -eq 0 ] || rc=1
done
exit $rc
