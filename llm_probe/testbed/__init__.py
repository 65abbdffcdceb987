"""An RLVR testbed that learns: a scratchpad addition task with 17-49-token completions, pinned warm starts of
about 1 M and 4 M parameters whose held-out accuracy leaves room to learn, runs labelled from the pre-RL start."""
