"""The ``serve`` stage: the drafter judged as it is served, by a real engine (llama.cpp on the CPU; SGLang or vLLM on
a GPU), against the target alone and each training-free mode, on the evaluate stage's requests: tokens per second,
the speed-up with its interval, acceptance greedy and sampled, losslessness, and each turn against evaluate's."""
