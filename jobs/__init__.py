"""The jobs: the top layer, which starts everything below it.

:mod:`jobs.cli` is the command line (``ipcjax JOB``). It imports scenes/, fitting/ and
baselines/; the library ``ipcjax`` imports none of them.
"""
