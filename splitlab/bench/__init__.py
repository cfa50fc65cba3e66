"""Benchmarks and sweeps on a GPU.

``timing``  CUDA-event timing with the L2 flushed, CUDA-graph replay over rotated inputs, and the ``Timer``s
            the sweep plugs in (``graph``, ``events``, and ``fake`` for CI)
``impls``   the implementation interface a sweep drives (splitlab's launchers; external ones)
``peers``   PyTorch's SDPA (flash, cuDNN) and FlexAttention decode paths
``peers_flashinfer``, ``peers_flashmla``  FlashInfer's paged decode and MLA, FlashMLA's dense MLA decode (imported
            only where their points run)
``cards``   kernel cards (``kernels/*.toml``): load and validate
``grid``    a card's named grid -> points (shapes x knobs, plus every planner's choice)
``sweep``   the runner behind ``splitlab sweep``: check, time, journal, resume
``env``     the environment of a sweep, for its sidecar
``decode``  ``splitlab bench``: the one-shot benchmark against PyTorch
``csvrows``  an A/B's CSV, written row by row and read back
``abharness``  what the kernel A/B scripts share (``experiments/mla_ws``, ``experiments/mqa_ws``): the command
            line, checks in child processes with a time limit, the budget, a checked and timed row, the summary
"""
