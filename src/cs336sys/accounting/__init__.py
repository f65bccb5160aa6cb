"""Parallelism accounting: memory, FLOPs and communication of training, as sympy formulas.

    symbols        the handout's symbols; LaTeX, evaluation, inequalities solved by sympy
    hardware       C, W and memory presets, each figure with its source
    compute        FLOPs of the handout's FFN and of our Transformer (attention included)
    memory         parameters, gradients, AdamW state, saved activations, by strategy
    communication  ring collectives and what each strategy sends per step
    ring           a step-by-step simulator of ring and alternate-ring all-reduce
    questions      the 2026 handout's section 8 problems and fsdp_accounting (a)
    communication_accounting   the 2025 handout's problem of that name
    plan           the calculator behind `python -m cs336sys.accounting`
    roofline       one training step's floor on one GPU: matmul FLOPs + the optimizer's bytes
    checks         predicted against measured (the model's tensors, FlopCounterMode, our results)
"""
