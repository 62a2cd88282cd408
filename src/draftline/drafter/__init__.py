"""The DFlash drafter model that the ``train`` and ``evaluate`` stages share, saved in z-lab's checkpoint layout.

Not a stage: it is the one package two stages import, so both depend on it in ``dvc.yaml``.
"""
