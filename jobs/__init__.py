"""The jobs: the top layer, which starts everything below it.

The layers point down only, ``jobs`` → ``baselines`` → ``fitting`` → ``scenes`` →
``ipcjax``: a module imports its own layer and those below, never one above
(tests/test_layering.py; docs/design.md, "Layers"). :mod:`jobs.cli` is the command line
(``ipcjax JOB``); :mod:`jobs.bag` turns ``ipcjax bag``'s flags, the film's E, μf and kθ
included, into :class:`scenes.bag_run.BagRunOptions`; :mod:`jobs.fit` turns ``ipcjax
fit``'s parsed flags into the typed options of the fit jobs in :mod:`fitting.rollout_fit`
and :mod:`fitting.bag_rest_fit`. A job that drives the IPC solver and a baseline side by
side lives here too, as part of neither: :mod:`jobs.compare` (``ipcjax compare --run``).
"""
