"""--gc-every N: Python's cyclic garbage collector run every N steps, between steps, instead of wherever an allocation
trips its thresholds (torchtitan's gc_freq, Megatron-LM's --manual-gc).

Why: a step allocates many short-lived Python objects (autograd nodes, tensor wrappers, the FP8 path's operands), so
the automatic collector runs inside steps, and its oldest-generation passes walk every live object, the model's
included, while the GPU drains the queue and idles (the 8B slice's profile: 5-16 ms at the start of some steps).
Here the objects alive when training starts (model, optimizer, data) are frozen out of every pass, automatic
collection is off, and a full pass runs before every N-th step, inside its timed window, so its cost is in the
step times. The price: reference cycles made by a step wait up to N steps for that pass, with any GPU memory they
hold. Off (0, the default): Python's own collector as usual.
"""

import gc

__all__ = ["ManualGC"]


class ManualGC:
    """start() before the training loop, before_step(step) before each step, stop() after the loop (however it ends)."""

    def __init__(self, every: int):
        self.every = every
        self._was_enabled = gc.isenabled()
        self._started = False

    def start(self) -> None:
        if self.every > 0:
            self._was_enabled = gc.isenabled()
            gc.collect()
            gc.freeze()  # what lives now lives for the run: no pass need walk it again
            gc.disable()
            self._started = True

    def before_step(self, step: int) -> None:
        """`step`: the steps done so far; a full pass before every N-th step after the first."""
        if self._started and step > 0 and step % self.every == 0:
            gc.collect()

    def stop(self) -> None:
        if self._started:
            gc.unfreeze()
            if self._was_enabled:
                gc.enable()
            self._started = False
