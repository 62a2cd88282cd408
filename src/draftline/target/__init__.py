"""The ``target`` stage: ``data/target/target.json`` describes the target (a real checkpoint used in place, or the
embedded one built here) for every later stage. ``describe`` reads a folder, ``stage`` writes ``data/target``,
``embedded`` builds the CPU stand-in. Later stages load the target through :mod:`draftline.core.target_loader`."""
