"""Train claims: what a training job says it did, and how the judge finds out whether it did.

A train claim is everything a train job hands in: the `[LOSS]` / `[EVAL]` / skip lines it printed (each step's
loss, grad norm, lr, time; the validation loss), the checkpoints it saved, and, by its milestone's metric rules,
that it ran as fast as it says or agrees with another job. The candidate's engine wrote all of it, so the judge
trusts none of it: it trusts only files it reads back itself, and the log and line times that arrived on its
own pipe. From those it re-derives, with its own code (nothing here imports the engine):

- the job it asked for: the config from the base commit's defaults and presets and the rendered argv
  (harness/judge/baseconfig.py), the checkpoints to leave (saveplan.py) and, as they appear, hard links to them
  out of the job's sight (keeper.py);
- the tensors: an allow-list reader of the job's checkpoints and their manifest (checkpoint_reader.py, manifest.py),
  never `torch.load` of a candidate pickle;
- model size, the final weights' loss on held-out text the judge draws with its secret seed (its own forward
  pass, reference.py), the applied lr fitted from two consecutive checkpoints (evidence.py), the lr contract at
  every printed step and every kept pair (contract.py);
- each verified step exactly: loss, grad norm and applied update against the judge's forward and backward pass on
  the batch the base engine states for that step (exactstep.py, batches.py), and, for a job verified on its final
  step alone, an untimed replay up to a secret step that must print the same numbers bit for bit (verify_train.py);
- printed numbers with fewer digits than the engine's documented format are refused (digits.py); two runs
  claimed to agree are compared in their checkpoints, every tensor (bitwise.py); MFU is recomputed from the
  model the milestone asked for and the judge's clock (measured_mfu.py).

`verify_train` (train.py) runs the train job's checks for the job gate; the metrics gate uses bitwise.py,
digits.py and measured_mfu.py. The pieces below this package (log parsing, base config, the sandbox) are shared with the
other gates.
"""

from harness.judge.claims.verify_train import Rerun, kept_pairs, verify_train

__all__ = ["Rerun", "verify_train", "kept_pairs"]
