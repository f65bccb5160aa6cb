#!/usr/bin/env bash
# Where the Gluon attention kernels and cuDNN's spend their time: Nsight Compute's full set (speed of
# light, warp states, scheduler, memory, source counters) over one warm launch of each, on a GPU host.
#
#   notes/runs/2026-11-27-h100-gluon/ncu_gluon.sh OUTDIR [SHAPE] [BACKWARDS] [FORWARDS]
#
# SHAPE is a notes/runs/2026-11-27-h100-leaderboard-clocks/flash_gluon_bench.py shape (lb25, lb26; default lb25); BACKWARDS the backwards to
# profile ('cudnn' and indices into BACKWARD_VARIANTS[d]; default cudnn,0), FORWARDS the forwards
# ('cudnn' and bench variant names; default cudnn,ws_pin_p_late, the default tiles). Writes per part
# (bwd, fwd): the report (.ncu-rep), its details page as CSV, and for each Gluon kernel and each
# cuDNN kernel the per-instruction source page (SASS, with each instruction's sampled stall reasons).
# Clocks are left alone (--clock-control none), as the device notes ask.
set -uo pipefail
out=${1:?usage: ncu_gluon.sh OUTDIR [SHAPE] [BACKWARDS] [FORWARDS]}
shape=${2:-lb25}
backwards=${3:-cudnn,0}
forwards=${4:-cudnn,ws_pin_p_late}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
for part in bwd fwd; do
    if [[ $part == bwd ]]; then what=(--profile-backward "$backwards"); else what=(--profile "$forwards"); fi
    [[ ${what[1]} == none ]] && continue
    ncu --clock-control none --profile-from-start off --set full -f -o "$out/${part}_$shape" \
        python3 notes/runs/2026-11-27-h100-leaderboard-clocks/flash_gluon_bench.py --out /tmp/ncu_gluon_rows --shapes "$shape" "${what[@]}" \
        > "$out/${part}_$shape.log" 2>&1 || { tail -n 20 "$out/${part}_$shape.log"; continue; }
    ncu -i "$out/${part}_$shape.ncu-rep" --csv --page details > "$out/${part}_${shape}_details.csv"
    for name in ours cudnn; do
        kernel=$([[ $name == ours ]] && echo 'regex:flash_(backward|forward)_gluon' || echo 'regex:sm90|cudnn|fmha|sdpa')
        ncu -i "$out/${part}_$shape.ncu-rep" --csv --page source --print-source sass \
            --kernel-name "$kernel" > "$out/${part}_${shape}_source_$name.csv" 2> "$out/${part}_${shape}_source_$name.err"
    done
done
ls -la "$out"
