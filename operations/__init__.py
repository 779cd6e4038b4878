"""specops: pyinfra operations and facts that converge GPU inference hosts to declared states.

The public surface, imported from deploy files (``from operations import gpu, server``):

- ``gpu``: ``gpu.idle`` (only GPU compute processes stopped, protected daemons never touched, a verdict)
- ``server``: ``server.running`` (a speculative server with config X, verified live), ``server.stopped``
- ``multinode``: ``multinode.running`` (one model over several hosts: ranks from the inventory, ordered starts, group restarts)
- ``sweep``: ``sweep.benchmarked`` (one config at one load, resumable), ``sweep.reported`` (tables, crossover, chart)
- ``facts``: ``facts.gpu.Gpus``, ``facts.server.Server``, ``facts.engine.EngineParse`` (JSON documents)
- ``errors``: the exception tree (``SpecopsError`` and its subclasses) and ``Issue``
- ``plan``: ``python -m operations.plan INVENTORY DEPLOY``, the dry run as a CI gate (exit 0/2/1)

Everything else is internal and says where it runs: ``model/`` (pure data and rules, no pyinfra),
``controller/`` (pyinfra-side steps the operations compose), ``remote/`` (stdlib programs that run on the
hosts, delivered as files), ``reporting/`` (results tables and charts).
"""
__all__ = ["errors", "facts", "gpu", "multinode", "plan", "server", "sweep"]
