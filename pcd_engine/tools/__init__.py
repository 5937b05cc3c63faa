"""The tools wing: what serves the ``pcd`` command line and the server, built on the engine and never imported by it.

* :mod:`.cli`: the ``pcd`` command, one module per sub-command (``models``, ``check``, ``run``, ``bench``,
  ``eval``, ``calibrate``, ``tag``, ``serve``).
* :mod:`.check`: ``pcd check``, the self-checks of a model and backend against plain references.
* :mod:`.bench` and :mod:`.eval`: ``pcd bench`` (speed on presets) and ``pcd eval`` (accuracy on labelled data),
  each against the baselines of :mod:`.baseline` (the model writing the JSON token by token, plain or under
  outlines), side by side in one run.
* :mod:`.datasets`: labelled data and classification metrics for ``pcd eval``.
* :mod:`.plots`: the charts of ``pcd bench --plot`` and ``pcd eval --plot``.
* :mod:`.examples`: the example presets shipped with pcd.
* :mod:`.serve`: ``pcd serve``, the web page, its JSON API and the OpenAI-compatible API.
* :mod:`.corpus`, :mod:`.tag_table` and :mod:`.tagging`: ``pcd tag``'s documents, table and resumable job.
"""

__all__: list[str] = []
