"""The DFlash drafter that the ``generate``, ``train`` and ``evaluate`` stages share, saved in z-lab's checkpoint layout.

Not a stage: it is the one package several stages import, so each depends on it in ``dvc.yaml``. ``modeling_dflash``
is the forward (the file every checkpoint carries), ``config`` the config and lineage a drafter is built from,
``model`` draftline's drafter module, ``checkpoint`` the files it is saved as and read from, ``decoding`` speculative
decoding with it.
"""
