"""The ``train`` stage: the DFlash drafter (:mod:`draftline.drafter`) trained online on the frozen target.

``data`` plans batches, ``anchors`` / ``masks`` / ``objective`` make the DFlash loss, ``memory`` refuses a run
that would not fit, ``warm_start`` starts the drafter from another drafter's weights (``train.init_from``), ``state``
keeps resumable states in the stage's scratch, ``trainer`` runs it, ``stage`` launches one process or torchrun.
"""
