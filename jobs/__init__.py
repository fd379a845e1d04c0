"""The jobs: the top layer, which starts everything below it.

:mod:`jobs.cli` is the command line (``ipcjax JOB``). A job that needs two layers that
do not import each other lives here too: :mod:`jobs.compare` runs the IPC bag (scenes/)
and the VBD baseline (baselines/). The library ``ipcjax`` imports none of the layers above.
"""
