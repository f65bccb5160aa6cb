"""Everything distributed, each concern in its own module; the model never knows it is distributed.

    process_group   joining a process group (NCCL on GPUs, gloo on the CPU), always with a timeout
    spawn           run a function on N ranks in fresh processes (tests, tools); fails fast, names the rank
"""
