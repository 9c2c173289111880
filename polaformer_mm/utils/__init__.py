"""Utilities: the one safe checkpoint reading path (:mod:`.checkpoint_io`), the shim of the
supported torch / numpy / Triton versions (:mod:`.compat`), and the run-time check of mmcv's
compiled ops (:mod:`.mmcv_ops`)."""
