"""Attention (problems 7-11): naive, FlashAttention-2 in PyTorch, in Triton (`tl`) and in Gluon (Hopper).

The map: what runs by default, what is composed into it, and what is an option kept because a test
uses it. Each module's first docstring line says the same.

Implementations (a model's `attention=` backend, or what an experiment times)
    naive.py                          default attention: naive_attention(q, k, v, is_causal), the model's
                                      backend and, in float64, the tests' reference
    flash_pytorch.py                  problems 9a, 10: FlashAttention2PyTorch (the assignment's adapter)
    flash_triton.py                   default flash: FlashAttention2Triton (problems 9b-11; the optimised
                                      step and the 8B step's "flash" and "flash_tuned" attention)
    flash_gluon.py                    Hopper only: FlashAttentionGluon (the 8B step's "gluon" attention,
                                      the flash_leaderboard_gluon points), its tile tables and launchers

Parts composed into them
    inputs.py                         the input checks every implementation makes
    flash_configs.py                  flash_triton's tile table (Tiles, BackwardConfig)
    flash_triton_forward.py           flash_triton's forward kernel
    flash_triton_backward.py          flash_triton's backward kernels
    flash_gluon_forward_ws.py         flash_gluon's default forward (warp-specialised)
    flash_gluon_forward.py            the tile loads, scores and softmax step the default forward
                                      composes; also the single-partition forward, which lost and nothing
                                      runs (it leaves with the Gluon experiments' next re-run)
    flash_gluon_backward_ws.py        flash_gluon's default backward (warp-specialised): kernel, launcher
    flash_gluon_backward_rotated.py   the default backward's consumer steps at d 64
    flash_gluon_backward_swapped.py   the default backward's consumer steps at d 128
    flash_gluon_backward_common.py    what the Gluon backwards share (tiles, TMA reduce-add, dQ layouts)

Options kept because a test runs them (`flash_gluon.BACKWARD_VARIANTS`: the measured variants)
    flash_gluon_backward.py           the single-partition Gluon backward
    (the warp-specialised backward's plain, late-dQ and own-dQ steps live in the files above)

Experiment points (`cs336sys.registry`)
    bench.py                          pytorch_attention, flash_benchmarking, flash_leaderboard
    bench_gluon.py                    flash_leaderboard_gluon
    bench_rounds.py                   flash_leaderboard_rounds (the implementations in interleaved rounds)

This package file imports nothing, so that a module using one implementation (the model uses the
naive one) is not tied, in its code hash or its imports, to the others; Triton in particular is
imported only by the modules that launch its kernels. What each variant measured: notes/flash_attention.md.
"""
