"""QuickJS executors: load a bundle, install the step API, drive one replay against the bridge.

The sandbox knows nothing of SQLite; it imports only `bridge`.
"""

__all__: list[str] = []
